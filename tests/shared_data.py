"""The real exports the tests read, and where they come from when ../shared/data is not there.

`shared_data_root()` answers the `shared_data` fixture (tests/conftest.py): the folder of real exports,
HARNESS_SHARED_DATA or ../shared/data when it holds every file of FILES; otherwise the cache
HARNESS_SHARED_DATA_CACHE (default ~/.cache/harness/shared-data) after fetching the missing files from their
public sources at the commits the SOURCE.md files name, each checked against its pinned SHA-256 (pooch); with
neither, `SharedDataUnavailable` whose message names the folder, the cache and what was tried (the fixture
skips with it).

Sources (../shared/data/*/SOURCE.md): every data file there was copied byte-exact from a public GitHub
repository at a pinned commit, so each has a stable raw-file URL (`URL`). What has none: README.md and the
SOURCE.md files, written by whoever laid out ../shared (no test reads them), and deepconsensus'
inference.tfrecord.gz, left out of ../shared and so of FILES. The digests are those of ../shared/data's copies; the
URLs could not be fetched where this was written (no internet but package registries).
"""
from __future__ import annotations

import functools
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("HARNESS_SHARED_DATA", ROOT.parent / "shared" / "data"))
CACHE = pathlib.Path(os.environ.get("HARNESS_SHARED_DATA_CACHE",
                                    pathlib.Path.home() / ".cache" / "harness" / "shared-data"))
URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
TIMEOUT_S = 30  # per request

# local folder -> (GitHub repository, commit, the folder's path in the repository), from the SOURCE.md files
ORIGINS = {
    "deepconsensus/HEAD/": ("google/deepconsensus", "979108ddbc0a950ea493071690507ac32c8ee9cb", ""),
    "deepconsensus/at_6c6d9eb8/": ("google/deepconsensus", "6c6d9eb8f2691df0ed7594f02a855b6fe022b058", ""),
    "gee-aces-image/": ("SERVIR/servir-aces", "96adfa50473e1e89f8107f07f8198b75944fc609", "tests/test_data/images/"),
    # tests/test_data/{training,validation,testing}/<split>.tfrecord.gz: one folder per split (see _repo_path)
    "gee-aces-points/": ("SERVIR/servir-aces", "96adfa50473e1e89f8107f07f8198b75944fc609", "tests/test_data/"),
    "tfx/": ("tensorflow/tfx", "58435d68d561e9ba6c657a0ec111adba5176ee98", ""),
}

# path under ../shared/data -> SHA-256 of its bytes
_DC_HEAD = "deepconsensus/HEAD/deepconsensus/testdata/human_1m/tf_examples/"
_DC_2021 = "deepconsensus/at_6c6d9eb8/deepconsensus/testdata/ecoli/output/"
_TFX = "tfx/tfx/components/testdata/"
FILES = {
    _DC_HEAD + "eval/eval.tfrecord.gz": "6a397c34ef4d702e84d44a42b6150b5c5e4397576d1bf5b95ce6896c0298812e",
    _DC_HEAD + "summary/summary.inference.json": "99849dd1e99a8c1014ed4d138fd148f2a312a21e30e99686cbb2f0dbdafb804e",
    _DC_HEAD + "summary/summary.training.json": "9e2e0cc21fd54f75e407124c3eab07917ad776601a19787f83def3db26a564f4",
    _DC_HEAD + "test/test.tfrecord.gz": "fda2d69d0a29bbd99368351c6804297297dc8ed02dc2bd73637d05a94a0f9da3",
    _DC_HEAD + "train/train.tfrecord.gz": "d04546c6456277307088ad38b3856a43fd980aea1b390e3a8d44ffea7e679673",
    _DC_2021 + "labels/labels-00000-of-00001.tfrecords.gz":
        "0f052feebcf2d41ceb1a96c454c7d1c0cd246c216ae550b8ca71cbfcaa7756d9",
    _DC_2021 + "predictions/deepconsensus-00000-of-00003.tfrecords.gz":
        "ab2aff98426b5e5fa72530da6d083e1e3fa026c745c1ca8d8495213dd0fc1dc6",
    _DC_2021 + "predictions/deepconsensus-00001-of-00003.tfrecords.gz":
        "0e2e077a70f00ae1a5a96c81b489afb4fdbd96e7d4aa35065b0ea2047e1ce212",
    _DC_2021 + "predictions/deepconsensus-00002-of-00003.tfrecords.gz":
        "8265d206586dfd1612a750cdad29acb582ac46e930d973076c250501cbfa9e45",
    _DC_2021 + "tf_examples/eval/eval-00000-of-00001.tfrecords.gz":
        "36faa417318878e27ff7e1aa7a3a5b2b09156b9f2b6a3d094a1b580f26cb42f5",
    _DC_2021 + "tf_examples/test/test-00000-of-00001.tfrecords.gz":
        "36faa417318878e27ff7e1aa7a3a5b2b09156b9f2b6a3d094a1b580f26cb42f5",
    _DC_2021 + "tf_examples/train/train-00000-of-00001.tfrecords.gz":
        "a6108ef9f2cb77112148de6d86d592b4e94384174a1ea79beabc3373210dcaa9",
    "gee-aces-image/image_2021.json": "ab7d3a4645f6bc051090f9920c3334fb9d9735e88ee0b6ed2d4ff4db4c7e4d78",
    "gee-aces-image/image_2021.tfrecord.gz": "c7ce477ecce0a0afebca961bf1c744f7890ca4d569b43c6165f75c3c1f62906d",
    "gee-aces-points/testing.tfrecord.gz": "1fa9bef8d046de720faf0d35c4e57d3b450e50b4fe9827372d0e6d7d9e6c479f",
    "gee-aces-points/training.tfrecord.gz": "5ddb46c2b9bdca5dc8dea60f6d6775c1f03b2933f2f98fe351217cffc584155c",
    "gee-aces-points/validation.tfrecord.gz": "c3e33760407b853cd81a16c3a7e88d0ea5c77bd2e8fcdf84845b6e67c9305add",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00000-of-00012.gz":
        "5560a25ed081494ddd0778263d5d7199e5ddf01236cf04d4882f7cbfe10a69ff",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00001-of-00012.gz":
        "2724460ef7c91deb8f92c351acacc1e7d821cb5b467a150bb78f2e6a3a39e3f6",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00002-of-00012.gz":
        "7eb038fbe670005e6539fcc04a2ffa18d861265df9bcde64a038342d7e239cbe",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00003-of-00012.gz":
        "73fd7afa18f517cfde1b54fc0335cacba83d2dceebcd488d4a7074525a9ce3fe",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00004-of-00012.gz":
        "d74a21fa68afbf90b0d3ae1026e109c0fe8dec46318d8e2d7d0b8ee33f6e14ef",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00005-of-00012.gz":
        "024aff6385ca57013039b6837acf483b2722ae7bcd4bf2b08a36e2dab2a71b9f",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00006-of-00012.gz":
        "b480ff9e1bdb047a72a32ab61486cb3e12bb536a93d591c1534f406ad15a8100",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00007-of-00012.gz":
        "485ec0ce16f0cb24e6c28a5b907bfe3a052a67c66358d16dff011f909eb3c620",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00008-of-00012.gz":
        "0c787416627ae5447aefc7bd4dd9a47fb17eb30d1fa12e1c7b0ef4c1560fb91b",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00009-of-00012.gz":
        "1a12a83539d596ed1b711d0fac676bf53f9091e6ba8ef8ddfa4806daee41bdad",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00010-of-00012.gz":
        "ea0a40f9a7c8d47f12bdae10221313cc5d2a4e0aca8daa255dbb13b3e7d95a50",
    _TFX + "csv_example_gen/Split-eval/data_tfrecord-00011-of-00012.gz":
        "d8bd26d627323a0f0611d3230112106ad8deb640c817d0ce554ca543e636f660",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00000-of-00012.gz":
        "f960c14f0a49e55244554b821aca46c8ea8554164ae1f39423d71a3daaca1449",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00001-of-00012.gz":
        "2a83925d8896dbc5abcb96ffd0822b9facd53d029088bb7ec3e28574679789af",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00002-of-00012.gz":
        "31a2a7d9e5d75c2036ca951f44d5dd85bf950820670ea8416a9f2ba866ce0e78",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00003-of-00012.gz":
        "06f7001e6428410cd54c102ad585383d7d7e96bc5cd8d321a1811cb2b3195a94",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00004-of-00012.gz":
        "f617ac4e71aebe8699c9f86c6be188e0b3faf24de90937a7f95ec532dec3b7bf",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00005-of-00012.gz":
        "15c9d06e4c7d6d7487a4df34aed291eec558b577fd591936c62b7510e7f20507",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00006-of-00012.gz":
        "e8d80a96914cdc563ede3ed4b83d739b792fbd8518f242185820b15c3389c943",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00007-of-00012.gz":
        "8d8fbddab2cb549b1c1a0d882dc730a6a0981326a6b3fc509ca027fd75ce04c3",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00008-of-00012.gz":
        "b878a2bdc388433c1c7c85b52910dd26c8d86b5f404b6633e774b5264360bf74",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00009-of-00012.gz":
        "636d9aa3a53884a68b85ee2d404595564df3caea91d60e4665a426bf4affc553",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00010-of-00012.gz":
        "4f1f7fbf2b67721c20656e434f28ee9508ef6770ce32ea273bcf041630de616c",
    _TFX + "csv_example_gen/Split-train/data_tfrecord-00011-of-00012.gz":
        "dee670a82536410e01ad192e2a7a89d732775745a5f7c8c517f25652cdcdde30",
    _TFX + "external/tfrecord/data_tfrecord-00000-of-00002.gz":
        "bf4858d3aa50e16a7bd51262aff7fbb867bdb83668960bad6b2052bf7381cb6c",
    _TFX + "external/tfrecord/data_tfrecord-00001-of-00002.gz":
        "a79dc65291fa83e42f54a8bfdb6ab057a7e99c173f1b6c42f81a43d8cd97daea",
    _TFX + "external/tfrecord_sequence/data_tfrecord-00000-of-00001.gz":
        "6a48e781d737c8311f3891969e901a8faef2b22740502b6eea3feee963318ae8",
    _TFX + "penguin/data/Split-eval/data_tfrecord-00000-of-00001.gz":
        "4b64f7f0ff513919bcc91d341a82c7aca1a6d77002c9f7e478330510ded8511f",
    _TFX + "penguin/data/Split-train/data_tfrecord-00000-of-00001.gz":
        "79b4b312b978da32514fb459dc5d7df7b50fcaa4a8696a6d1a72bb3f45f193c3",
    _TFX + "penguin/schema/schema.pbtxt": "a2f97051665674e425d67678d033a11de5e21093375c74655302de0ed82aff9b",
    _TFX + "schema_gen/schema.pbtxt": "9464ab080a991a47cd8ca19d833133d36310305d7b90e75b49a6db4883470201",
    _TFX + "schema_gen_sequence/schema.pbtxt": "e59ef41241cb9a1a78f2f32b2d74bb3a92d3a374c3aab81408265c1d4696c0c8",
    _TFX + "tfrecord_sequence/Split-eval/data_tfrecord_eval.gz":
        "b418bbfce34f4d53147e496143480e275ba932e1c315dadcf929ac99be0aa7d4",
    _TFX + "tfrecord_sequence/Split-train/data_tfrecord_train.gz":
        "be3a2a64784d9d315cabd892840aeb475a458309072c7ff280ef0e9caad3564f",
}


class SharedDataUnavailable(Exception):
    """Neither the shared folder nor the cache holds the real exports, and they could not be fetched."""


def url(local: str) -> str:
    """The public raw-file URL of `local` (a key of FILES)."""
    prefix = next(p for p in ORIGINS if local.startswith(p))
    repo, commit, folder = ORIGINS[prefix]
    return URL.format(repo=repo, commit=commit, path=folder + _repo_path(prefix, local[len(prefix):]))


def _repo_path(prefix: str, rest: str) -> str:
    if prefix == "gee-aces-points/":
        return f"{rest.split('.')[0]}/{rest}"  # training.tfrecord.gz lives in tests/test_data/training/
    return rest


def fetch(local: str, cache: pathlib.Path, *, downloader=None) -> pathlib.Path:
    """`cache/local`, downloaded from `url(local)` unless already there with the pinned digest.

    Raises:
      ValueError: the downloaded bytes' SHA-256 is not FILES[local] (nothing is left in the cache).
      ImportError: pooch is not installed (the `test` extra).
      requests.RequestException and OSError: the download failed.
    """
    import pooch

    target = cache / local
    downloader = downloader or pooch.HTTPDownloader(timeout=TIMEOUT_S, progressbar=False)
    return pathlib.Path(pooch.retrieve(url(local), known_hash=f"sha256:{FILES[local]}", fname=target.name,
                                       path=target.parent, downloader=downloader))


def missing(folder: pathlib.Path) -> list[str]:
    """The files of FILES that `folder` lacks."""
    return [local for local in FILES if not (folder / local).is_file()]


@functools.lru_cache(maxsize=None)
def shared_data_root(shared: pathlib.Path = SHARED_DATA, cache: pathlib.Path = CACHE) -> pathlib.Path:
    """`shared` when it holds every file; else `cache`, fetching what it lacks or holds with another digest (one
    failure stops the fetch).

    Raises:
      SharedDataUnavailable: with what was looked for and tried.
    """
    absent = missing(shared)
    if not absent:
        return shared
    looked = (f"real exports not in {shared} (HARNESS_SHARED_DATA; {len(absent)} of {len(FILES)} files missing, "
              f"e.g. {absent[0]})")
    for local in FILES:
        try:
            fetch(local, cache)
        except Exception as e:  # ImportError, network, digest: each is a reason to skip, named in the message
            raise SharedDataUnavailable(f"{looked}, and fetching them into {cache} (HARNESS_SHARED_DATA_CACHE) "
                                        f"failed: {url(local)}: {type(e).__name__}: {e}") from e
    return cache
