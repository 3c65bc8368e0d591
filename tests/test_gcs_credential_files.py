"""A credential file TensorFlow's Cloud Storage file system cannot use (a Workload Identity Federation
`external_account` file: google-github-actions/auth#210) is refused by name before the first read; in-process."""
import contextlib
import io
import json

from harness import cli
from harness.data.export import gcs

WIF = {"type": "external_account", "audience": "//iam.googleapis.com/projects/1/locations/global/"
       "workloadIdentityPools/github/providers/github", "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
       "token_url": "https://sts.googleapis.com/v1/token", "credential_source": {"file": "/tmp/token"}}
WHY = ("type 'external_account' (Workload Identity Federation), which TensorFlow's Cloud Storage file system cannot "
       "use: it takes a service-account key file or gcloud's user login only; use one of those, run on Google Cloud "
       "with a service account (GKE Workload Identity), or put an access token in GOOGLE_AUTH_TOKEN_FOR_TESTING "
       "(google-github-actions/auth with token_format: access_token; it lasts an hour)")


def test_a_federation_file_is_refused_by_name_and_the_command_exits_2(tmp_path, monkeypatch):
    key = tmp_path / "wif.json"
    key.write_text(json.dumps(WIF))
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(key), "HOME": str(tmp_path), "GCE_METADATA_HOST": "127.0.0.1:1",
           "HARNESS_GCS_PROBE_S": "1"}
    assert gcs.find_credentials(env) == (None, [f"GOOGLE_APPLICATION_CREDENTIALS={key} ({WHY})"])
    # gcloud's application-default file of the same kind: TensorFlow goes on to the metadata server, as does this
    adc = tmp_path / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir()
    adc.write_text(json.dumps(WIF))
    source, tried = gcs.find_credentials(dict(env, GOOGLE_APPLICATION_CREDENTIALS="", CLOUDSDK_CONFIG=str(adc.parent)))
    assert source is None and tried[1] == f"gcloud's application-default file {adc} ({WHY})"
    # the kinds TensorFlow takes stay accepted
    for kind in ({"type": "service_account", "private_key": "k"}, {"type": "authorized_user", "refresh_token": "t"}):
        key.write_text(json.dumps(kind))
        assert gcs.find_credentials(env)[0] == f"GOOGLE_APPLICATION_CREDENTIALS={key}"
    key.write_text(json.dumps(WIF))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(gcs, "_checked", {})
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["inspect", "gs://bucket/export"])
    assert code == 2
    assert err.getvalue().strip().splitlines() == [
        f"harness inspect: CredentialsError: gs://bucket/export: no Google Cloud credentials: tried "
        f"GOOGLE_APPLICATION_CREDENTIALS={key} ({WHY}). Set GOOGLE_APPLICATION_CREDENTIALS to a service-account key "
        "file, or run `gcloud auth application-default login`, or run on Google Cloud with a service account"]
