"""A key at the door: the openai client with the key works, nothing else gets past /health."""
import shutil
import ssl
import subprocess
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from course.final.cli import main, make_parser
from course.final.security.api_key import Door
from course.final.security.options import KEY_VARIABLE, door_from_args, uvicorn_options
from course.final.stress.fuzz_headers import run_header_fuzz
from course.final.testing import free_port, running_server, tiny_engine

KEYS = ("sk-one", "sk-two")


@pytest.fixture(scope="module")
def server(byte_tok):
    with running_server(tiny_engine(byte_tok, max_waiting=8), byte_tok, door=Door(KEYS)) as (url, _):
        yield url


def test_the_openai_client_with_a_key_works_unchanged(server):
    for key in KEYS:
        client = openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0)
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].text is not None
        assert client.chat.completions.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        assert [m.id for m in client.models.list()] == ["tiny"]


def test_a_wrong_key_is_refused_in_openais_shape(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="sk-three", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert e.value.status_code == 401
    assert e.value.body == {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                            "param": None, "code": "invalid_api_key"}


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("GET", "/v1/unknown"), ("GET", "/docs"), ("GET", "/openapi.json"),
])
def test_every_route_but_health_and_metrics_needs_the_key(server, method, path):
    r = httpx.request(method, server + path, json={})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in r.json()["error"]["message"]  # says how to send it
    assert httpx.get(server + "/health").status_code == 200
    assert httpx.get(server + "/metrics").status_code == 200


def test_scheme_is_case_insensitive_and_keys_are_whole(server):
    get = lambda value: httpx.get(server + "/v1/models", headers={"Authorization": value}).status_code  # noqa: E731
    assert get("bearer sk-one") == get("BEARER sk-two") == 200
    assert get("Bearer sk-on") == get("Bearer sk-one,sk-two") == get("Bearer sk-onesk-two") == 401


def test_metrics_behind_the_key_when_asked(byte_tok):
    with running_server(tiny_engine(byte_tok), byte_tok, door=Door(KEYS, metrics_need_key=True)) as (url, _):
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer sk-one"}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200


def test_hostile_authorization_headers_get_401_never_5xx(server):
    report = run_header_fuzz(server, KEYS[0])
    assert report.ok(), report.violations[:10]
    assert report.server_errors == 0 and report.hangs == 0 and report.statuses.get(401, 0) >= 100


def parse(*flags: str):
    return make_parser()[0].parse_args(["serve", *flags])


def test_keys_from_flags_commas_or_the_environment():
    assert door_from_args(parse("--api-key", "a,b", "--api-key", " c "), environ={}).keys == ("a", "b", "c")
    assert door_from_args(parse(), environ={KEY_VARIABLE: "x, y"}).keys == ("x", "y")
    assert door_from_args(parse("--api-key", "z"), environ={KEY_VARIABLE: "x"}).keys == ("z",)  # the flag wins
    assert door_from_args(parse(), environ={}).keys == ()


def test_open_port_without_a_key_warns_at_start():
    said = []
    uvicorn_options("0.0.0.0", Door(), log=said.append)
    uvicorn_options("127.0.0.1", Door(), log=said.append)
    uvicorn_options("::1", Door(), log=said.append)
    uvicorn_options("0.0.0.0", Door(("k",)), log=said.append)
    assert len(said) == 1 and "0.0.0.0 without an API key" in said[0]


def test_tls_flags_are_checked_before_the_model_loads(tmp_path, capsys):
    assert main(["serve", "--ssl-keyfile", str(tmp_path / "key.pem")]) == 2
    assert "go together" in capsys.readouterr().err
    missing = ["--ssl-keyfile", str(tmp_path / "k"), "--ssl-certfile", str(tmp_path / "c")]
    assert main(["serve", *missing]) == 2
    assert "cannot read" in capsys.readouterr().err


def self_signed(tmp_path) -> tuple[str, str]:
    """A key and a self-signed certificate for 127.0.0.1, with `cryptography` if installed, else openssl."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is here")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        return str(key), str(cert)
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False).sign(private, hashes.SHA256()))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return str(key), str(cert)


def test_https_with_the_tls_flags(tmp_path, byte_tok):
    """The flags' files reach uvicorn: the server answers over TLS, and the key still applies."""
    key, cert = self_signed(tmp_path)
    door = door_from_args(parse("--api-key", "sk-tls", "--ssl-keyfile", key, "--ssl-certfile", cert), environ={})
    from course.final.cli import assemble_app
    engine = tiny_engine(byte_tok)
    app = assemble_app(engine, byte_tok, "tiny", door=door)
    engine.start()
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                            log_level="warning", **uvicorn_options("127.0.0.1", door))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        url, trusted = f"https://127.0.0.1:{config.port}", ssl.create_default_context(cafile=cert)
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-tls", max_retries=0,
                               http_client=httpx.Client(verify=trusted))
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(url + "/v1/models", verify=trusted).status_code == 401
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{config.port}/health", timeout=5)  # plain HTTP is not served
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()
