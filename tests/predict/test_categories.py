"""A class map's names where GDAL (gdalinfo) and QGIS, through GDAL, read them: the PAM sidecar
`<map>.tif.aux.xml` that `harness.predict.maps.categories_xml` writes, read back by GDAL's own GDALInfo()
(tests/gdal_info.py) on a small GeoTIFF, with names that XML must escape."""
import numpy as np

from gdal_info import attribute_table, categories, gdalinfo
from harness.predict import maps


def test_gdal_reads_the_class_names_and_the_attribute_table_written_beside_the_map(tmp_path):
    import rasterio
    from rasterio.transform import Affine

    names = ["water & shore", "rice, paddy", "forest <dense>", 'built "urban"']
    path = tmp_path / "map.tif"
    with rasterio.open(path, "w", driver="GTiff", width=4, height=4, count=1, dtype="uint8", nodata=255,
                       crs="EPSG:4326", transform=Affine(0.1, 0, 89.0, 0, -0.1, 27.0)) as dst:
        dst.write(np.arange(16, dtype=np.uint8).reshape(1, 4, 4) % 4)
    (tmp_path / ("map.tif" + maps.PAM_SUFFIX)).write_text(maps.categories_xml(names))
    info = gdalinfo(str(path), "-noct")
    assert str(tmp_path / "map.tif.aux.xml") in info
    assert categories(info) == names
    rows = attribute_table(info)
    assert [r[:2] for r in rows] == [[str(i), n] for i, n in enumerate(names)]
    assert [[int(v) for v in r[2:]] for r in rows] == [list(c) for c in maps.colours(len(names))]
