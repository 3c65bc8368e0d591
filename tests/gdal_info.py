"""`gdalinfo` as the tests run it: GDAL's own `GDALInfo()` (the function the gdalinfo program prints;
apps/gdalinfo_bin.cpp) in the libgdal that rasterio's wheel bundles, called through ctypes: what GDAL, and QGIS
through it, reads of a raster and its sidecars, without Debian's gdal-bin (43 packages)."""
import ctypes
import glob
import os


def _lib():
    import rasterio

    found = glob.glob(os.path.join(os.path.dirname(rasterio.__file__) + ".libs", "libgdal*.so*"))
    if not found:
        raise RuntimeError(f"no libgdal beside rasterio {rasterio.__version__} ({os.path.dirname(rasterio.__file__)}"
                           ".libs): a rasterio wheel bundles one")
    lib = ctypes.CDLL(found[0])
    lib.GDALAllRegister()
    lib.GDALOpen.restype, lib.GDALOpen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    lib.GDALInfoOptionsNew.restype = ctypes.c_void_p
    lib.GDALInfoOptionsNew.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p]
    lib.GDALInfo.restype, lib.GDALInfo.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
    lib.GDALInfoOptionsFree.argtypes = [ctypes.c_void_p]
    lib.GDALClose.argtypes = [ctypes.c_void_p]
    lib.VSIFree.argtypes = [ctypes.c_void_p]
    return lib


def gdalinfo(path: str, *args: str) -> str:
    """What `gdalinfo ARGS PATH` prints (e.g. "-nomd"). Raises FileNotFoundError when GDAL cannot open PATH."""
    lib = _lib()
    ds = lib.GDALOpen(str(path).encode(), 0)
    if not ds:
        raise FileNotFoundError(f"GDAL cannot open {path}")
    argv = (ctypes.c_char_p * (len(args) + 1))(*[a.encode() for a in args], None)
    options = lib.GDALInfoOptionsNew(argv, None)
    try:
        text = lib.GDALInfo(ds, options)
        try:
            return ctypes.string_at(text).decode()
        finally:
            lib.VSIFree(text)
    finally:
        lib.GDALInfoOptionsFree(options)
        lib.GDALClose(ds)


def categories(info: str) -> list[str]:
    """The band's "Categories:" of a gdalinfo text, in value order (GDAL prints `      <value>: <name>`)."""
    import re

    block = info.partition("  Categories:\n")[2]
    return [m.group(2) for m in re.finditer(r"^      (\d+): (.*)$", block.split("\n  Color Table", 1)[0]
                                            .split("\n<", 1)[0], re.M)]


def attribute_table(info: str) -> list[list[str]]:
    """The rows of the band's raster attribute table in a gdalinfo text (its XML: `<Row><F>...</F>...</Row>`)."""
    import re

    import html

    return [[html.unescape(f) for f in re.findall(r"<F>([^<]*)</F>", row)]
            for row in re.findall(r"<Row index=\"\d+\">(.*?)</Row>", info, re.S)]
