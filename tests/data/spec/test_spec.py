import pytest
import yaml

from harness.data.export import shards as S
from harness.data.spec import dataspec as SP, infer, validate
from harness.errors import SpecError


def test_infer_real_points(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-points" / "*.tfrecord.gz"))
    spec = infer.infer_spec(found)
    assert spec.kind == "table" and spec.label == "class" and len(spec.bands) == 8
    assert spec.dtype_of("class") == "float"  # Earth Engine stores the label as float
    assert spec.input_shape == (8,) and spec.label_shape == ()
    assert validate.validate_spec(spec, found).checked


def test_infer_real_image_with_renamed_mixer(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-image"))
    spec = infer.infer_spec(found, mixer=S.find_mixer(found), group_bands=True)
    assert spec.kind == "image" and spec.patch_size == 256 and spec.kernel_margin == 0
    assert spec.band_groups == {"before": ("blue_before", "green_before", "nir_before", "red_before"),
                                "during": ("blue_during", "green_during", "nir_during", "red_during")}
    assert spec.input_shape == {"before": (256, 256, 4), "during": (256, 256, 4)}
    assert spec.replace(group_delivery="time").input_shape == (2, 256, 256, 4)


def test_infer_margin_from_mixer(image_export):
    found = S.discover_shards(str(image_export))
    spec = infer.infer_spec(found, mixer=S.find_mixer(found))
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
    ({"bands": ["a"], "dtype": "double"}, r"data.dtype: expected one of float, int64, bytes; got 'double' \(str\)"),
    ({"bands": ["a"], "kind": "image"}, "patch_size"),
    ({"bands": ["a", "a"]}, "twice"),
    ({"band_groups": {"x": ["a"], "y": ["b", "c"]}, "group_delivery": "time"}, "equal size"),
    ({"bands": ["a", "y"], "label": "y"}, "also declared as a band"),
])
def test_bad_config(config, match):
    with pytest.raises(SpecError, match=match):
        SP.DataSpec.from_config(config)


@pytest.mark.parametrize("text, match", [
    ("patch_size: '16'", r"data.patch_size: expected a positive integer, got '16' \(str\)"),
    ("patch_size: true", r"data.patch_size: expected a positive integer, got True \(bool\)"),
    ("patch_size: 0", r"data.patch_size: expected a positive integer, got 0 \(int\)"),
    ("patch_size: 16.0", r"data.patch_size: expected a positive integer, got 16.0 \(float\)"),
    ("patch_size: 8\nkernel_margin: four", r"data.kernel_margin: expected an integer >= 0, got 'four' \(str\)"),
    ("patch_size: 8\nkernel_margin: -2", r"data.kernel_margin: expected an integer >= 0, got -2 \(int\)"),
    ("patch_size: 8\nresize: '32'", r"data.resize: expected a positive integer, got '32' \(str\)"),
    ("num_classes: five", r"data.num_classes: expected a positive integer, got 'five' \(str\)"),
    ("num_classes: false", r"data.num_classes: expected a positive integer, got False \(bool\)"),
    ("bands: B2", r"data.bands: expected a list of band names, got 'B2' \(str\); write bands: \[B2\]"),
    ("bands: {B2: 1}", r"data.bands: expected a list of band names, got \{'B2': 1\} \(dict\)"),
    ("bands: [B2, 3]", r"data.bands\[1\]: expected a band name .*got 3 \(int\)"),
    ("band_groups: {t1: red_1, t2: [red_2]}",
     r"data.band_groups.t1: expected a list of band names, got 'red_1' \(str\); write t1: \[red_1\]"),
    ("band_groups: [a, b]", r"data.band_groups: expected a mapping group: \[bands\], got \['a', 'b'\] \(list\)"),
    ("bands: [a]\ndtypes: {a: double}", r"data.dtypes.a: expected one of float, int64, bytes; got 'double'"),
    ("bands: [a]\ndtypes: [a]", r"data.dtypes: expected a mapping feature: dtype, got \['a'\] \(list\)"),
    ("bands: [a]\nlabel: 3", r"data.label: expected a feature name \(a string\), got 3 \(int\)"),
    ("bands: [a]\nlabel: [y]", r"data.label: expected a feature name \(a string\), got \['y'\] \(list\)"),
    ("bands: [a]\nkind: imag", r"data.kind: expected one of image, table; got 'imag' \(str\)"),
    ("bands: [a]\ntask: regresion", r"data.task: expected one of classification, regression; got 'regresion'"),
    ("bands: [a]\ngroup_delivery: stack", r"data.group_delivery: expected one of dict, time; got 'stack'"),
    ("bands: [a]\ncrop_margin: 'yes'", r"data.crop_margin: expected true or false, got 'yes' \(str\)"),
    ("bands: [a]\ncrop_margin: 1", r"data.crop_margin: expected true or false, got 1 \(int\)"),
    ("bands: [a]\n3: x", r"unknown data config key 3"),
])
def test_config_value_types_are_named(text, match):
    with pytest.raises(SpecError, match=match):
        SP.DataSpec.from_config(yaml.safe_load(text))


@pytest.mark.parametrize("data", [5, "bands: [a]", ["a"]])
def test_config_section_must_be_a_mapping(data):
    with pytest.raises(SpecError, match=r"^data: expected a mapping .*got "):
        SP.DataSpec.from_config(data)


def test_config_yaml_booleans_and_null_defaults():
    spec = SP.DataSpec.from_config(yaml.safe_load("bands: [a]\npatch_size: 4\ncrop_margin: yes\nresize: null"))
    assert spec.crop_margin is True and spec.resize is None and spec.kernel_margin == 0
    assert SP.DataSpec.from_config({"bands": ("a", "b")}).bands == ("a", "b")


def test_infer_refuses_a_label_that_is_not_a_name(image_export):
    with pytest.raises(SpecError, match=r"data.label: expected a feature name \(a string\), got 3 \(int\)"):
        infer.infer_spec(S.discover_shards(str(image_export)), label=3)


def test_guess_band_groups_needs_matching_stems():
    assert infer.guess_band_groups(["red_t1", "nir_t1", "red_t2", "nir_t2"]) == {
        "t1": ("red_t1", "nir_t1"), "t2": ("red_t2", "nir_t2")}
    assert infer.guess_band_groups(["red_t1", "nir_t1", "red_t2"]) == {}
    assert infer.guess_band_groups(["B2", "B3"]) == {}


# --- refine: what the config or flags declare refines the inferred spec (issue 11, item 8) --------------------------
def test_declared_bands_keep_inferred_dtypes(shared_data):
    """TFX taxi: `--label trip_start_hour --bands trip_miles fare trip_seconds` kept trip_seconds as float before
    (FeatureDtypeError: expected float, found int64), although inference had found int64."""
    split = shared_data / "tfx/tfx/components/testdata/csv_example_gen/Split-train"
    found = S.discover_shards(str(split))
    declared = {"label": "trip_start_hour", "bands": ["trip_miles", "fare", "trip_seconds"]}
    spec = infer.refine(infer.infer_spec(found, label="trip_start_hour"), declared)
    assert spec.bands == ("trip_miles", "fare", "trip_seconds") and spec.label == "trip_start_hour"
    assert [spec.dtype_of(f) for f in spec.features] == ["float", "float", "int64", "int64"]
    assert validate.validate_spec(spec, found).checked


def test_declared_bands_on_a_bytes_export_stay_bytes(tmp_path):
    from harness.data.export import synth
    synth.write_image_export(str(tmp_path), shards=1, records=2, patch_size=8, dtype="bytes")
    found = S.discover_shards(str(tmp_path))
    spec = infer.refine(infer.infer_spec(found, mixer=S.find_mixer(found)), {"bands": ["B3", "B2"]})
    assert spec.bands == ("B3", "B2") and spec.dtype_of("B3") == spec.dtype_of("B2") == "bytes"
    assert validate.validate_spec(spec, found).checked
    assert infer.refine(infer.infer_spec(found), {"bands": ["B2"], "dtype": "bytes"}).dtype_of("B2") == "bytes"
    with pytest.raises(SpecError, match="data.dtype"):
        infer.refine(infer.infer_spec(found), {"dtype": "double"})


def test_declared_margin_without_mixer_keeps_the_stored_side(tmp_path):
    """An export without its mixer: the stored side (72) is all inference sees, as patch_size 72, margin 0.
    Declaring kernel_margin 8 alone gave patch_size 72 + 8 = 80 before; the stored side is a fact: P = 72 - 8."""
    from harness.data.export import synth
    synth.write_image_export(str(tmp_path), shards=1, records=2, patch_size=64, kernel_size=8)
    for mixer in tmp_path.glob("*mixer.json"):
        mixer.unlink()
    found = S.discover_shards(str(tmp_path))
    inferred = infer.infer_spec(found)
    assert (inferred.patch_size, inferred.kernel_margin) == (72, 0)
    spec = infer.refine(inferred, {"kernel_margin": 8, "crop_margin": True})
    assert (spec.patch_size, spec.kernel_margin, spec.stored_size, spec.output_size) == (64, 8, 72, 64)
    assert infer.refine(inferred, {"patch_size": 64}).kernel_margin == 8
    with pytest.raises(SpecError, match="kernel_margin: 72 does not fit the stored patch side 72"):
        infer.refine(inferred, {"kernel_margin": 72})


def test_ignore_label_and_class_names_in_the_config():
    spec = SP.DataSpec.from_config({"bands": ["a", "b"], "label": "lc", "ignore_label": 255,
                                    "class_names": ["water", "crop"], "num_classes": 2})
    assert spec.ignore_label == 255 and spec.class_names == ("water", "crop")
    assert SP.DataSpec.from_config(spec.to_config()) == spec
    regression = SP.DataSpec.from_config({"bands": ["a"], "label": "y", "task": "regression", "ignore_label": -9999.5})
    assert regression.ignore_label == -9999.5
    for config, match in [({"ignore_label": "255"}, r"data.ignore_label: expected a finite number, got '255' \(str\)"),
                          ({"ignore_label": True}, r"data.ignore_label: expected a finite number, got True"),
                          ({"ignore_label": 2.5}, r"ignore_label 2.5: a classification label is an integer"),
                          ({"class_names": "water"}, r"data.class_names: expected a list of class names, got "
                                                     r"'water' \(str\); write class_names: \[water\]"),
                          ({"class_names": ["a", "b", "c"], "num_classes": 2},
                           "class_names has 3 names for num_classes 2"),
                          ({"class_names": ["a"], "task": "regression"}, "class_names are for task classification"),
                          ({"ignore_label": 1e39, "task": "regression"},
                           r"ignore_label 1e\+39 is beyond the float32 range of label 'y'")]:
        with pytest.raises(SpecError, match=match):
            SP.DataSpec.from_config({"bands": ["a"], "label": "y", **config})
