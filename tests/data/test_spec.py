import pytest
import yaml

from harness.data import shards as S, spec as SP
from harness.errors import SpecError


def test_infer_real_points(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-points"))
    spec = SP.infer_spec(found)
    assert spec.kind == "table" and spec.label == "class" and len(spec.bands) == 8
    assert spec.dtype_of("class") == "float"  # Earth Engine stores the label as float
    assert spec.input_shape == (8,) and spec.label_shape == ()
    assert SP.validate_spec(spec, found).checked


def test_infer_real_image_with_renamed_mixer(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-image"))
    spec = SP.infer_spec(found, mixer=S.find_mixer(found), group_bands=True)
    assert spec.kind == "image" and spec.patch_size == 256 and spec.kernel_margin == 0
    assert spec.band_groups == {"before": ("blue_before", "green_before", "nir_before", "red_before"),
                                "during": ("blue_during", "green_during", "nir_during", "red_during")}
    assert spec.input_shape == {"before": (256, 256, 4), "during": (256, 256, 4)}
    assert spec.replace(group_delivery="time").input_shape == (2, 256, 256, 4)


def test_infer_margin_from_mixer(image_export):
    found = S.discover_shards(str(image_export))
    spec = SP.infer_spec(found, mixer=S.find_mixer(found))
    assert (spec.patch_size, spec.kernel_margin, spec.stored_size) == (8, 4, 12)
    assert spec.label == "landcover" and spec.bands == ("B2", "B3", "B4")
    assert spec.input_shape == (12, 12, 3) and spec.replace(crop_margin=True).input_shape == (8, 8, 3)
    assert spec.replace(resize=16).label_shape == (16, 16)


def test_from_config_yaml_round_trip():
    text = """
    data:
      band_groups: {before: [red_b, nir_b], during: [red_d, nir_d]}
      group_delivery: time
      label: landcover
      dtypes: {red_b: int64, landcover: int64}
      patch_size: 64
      kernel_margin: 32
      crop_margin: true
      num_classes: 5
    """
    spec = SP.DataSpec.from_config(yaml.safe_load(text)["data"])
    assert spec.kind == "image" and spec.bands == ("red_b", "nir_b", "red_d", "nir_d")
    assert spec.dtype_of("red_b") == "int64" and spec.dtype_of("nir_b") == "float"
    assert spec.input_shape == (2, 64, 64, 2) and spec.label_shape == (64, 64)
    assert SP.DataSpec.from_config(spec.to_config()) == spec


@pytest.mark.parametrize("config, match", [
    ({"bands": ["a"], "lable": "y"}, "did you mean 'label'"),
    ({"bands": ["a"], "dtype": "double"}, "dtype must be one of"),
    ({"bands": ["a"], "kind": "image"}, "patch_size"),
    ({"bands": ["a", "a"]}, "twice"),
    ({"band_groups": {"x": ["a"], "y": ["b", "c"]}, "group_delivery": "time"}, "equal size"),
    ({"bands": ["a", "y"], "label": "y"}, "also declared as a band"),
])
def test_bad_config(config, match):
    with pytest.raises(SpecError, match=match):
        SP.DataSpec.from_config(config)


def test_guess_band_groups_needs_matching_stems():
    assert SP.guess_band_groups(["red_t1", "nir_t1", "red_t2", "nir_t2"]) == {
        "t1": ("red_t1", "nir_t1"), "t2": ("red_t2", "nir_t2")}
    assert SP.guess_band_groups(["red_t1", "nir_t1", "red_t2"]) == {}
    assert SP.guess_band_groups(["B2", "B3"]) == {}
