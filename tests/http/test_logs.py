"""Request ids, 5xx logging, structured logs with redaction, the Content-Type check and the
flag on answers beyond 2^53 (vrambudget/http/logs.py, problems.py), in a small app built the
way both apps are."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from litestar import Litestar, Request, get, post
from litestar.testing import TestClient

from vrambudget.http.body import decode_body
from vrambudget.http.logs import (
    JsonFormatter,
    RequestContext,
    TextFormatter,
    logging_config,
    redact,
    unsafe_integers,
)
from vrambudget.http.problems import exception_handlers


@get("/boom")
async def boom() -> None:
    raise RuntimeError("kaboom")


@get("/big")
async def big() -> dict[str, Any]:
    return {"small": 2**53, "big": 2**53 + 1, "list": [2**60, 1.5, "12345678901234567890"]}


@post("/echo", status_code=200)
async def echo(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return decode_body(await request.body(), dict[str, Any])


def _app() -> Litestar:
    return Litestar(
        [boom, big, echo],
        middleware=[RequestContext()],
        exception_handlers=exception_handlers(),
        logging_config=logging_config("text"),
    )


@pytest.fixture()
def client() -> Any:
    with TestClient(_app()) as c:
        yield c


def test_a_500_is_logged_with_its_traceback_and_the_request_id_it_answers(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="vrambudget.errors"):
        r = client.get("/boom")
    assert r.status_code == 500
    body = r.json()
    rid = body["request_id"]
    assert rid and r.headers["x-request-id"] == rid
    records = [rec for rec in caplog.records if rec.name == "vrambudget.errors"]
    assert len(records) == 1
    record = records[0]
    assert record.request_id == rid and rid in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == rid and "kaboom" in line["exc"] and line["status"] == 500


def test_a_sane_incoming_request_id_is_kept_and_a_bad_one_replaced(client: Any) -> None:
    assert client.get("/big", headers={"X-Request-ID": "abc-123.x:y_z"}).headers[
        "x-request-id"
    ] == ("abc-123.x:y_z")
    for bad in ("a b", "x" * 129, "<script>", ""):
        rid = client.get("/big", headers={"X-Request-ID": bad}).headers["x-request-id"]
        assert rid != bad and len(rid) == 32
    r = client.post("/echo", content=b"{")
    assert r.status_code == 400 and "request_id" not in r.json()  # 4xx: the caller's error
    assert r.headers["x-request-id"]


def test_every_request_has_an_access_line_without_the_query_string(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="vrambudget.access"):
        client.get("/big?token=s3cret&x=1", headers={"X-Request-ID": "r1"})
    (record,) = [rec for rec in caplog.records if rec.name == "vrambudget.access"]
    line = json.loads(JsonFormatter().format(record))
    assert line["path"] == "/big" and line["status"] == 200 and line["request_id"] == "r1"
    assert "s3cret" not in json.dumps(line) and line["duration_ms"] >= 0


def test_secrets_and_query_strings_are_redacted_in_both_formats() -> None:
    message = (
        "callback https://hooks.example/p?sig=abc&token=t0k failed; Authorization: Bearer "
        'eyJhbGc.x.y webhook_secret=hunter2 {"token": "tok-1", "password": "pw"}'
    )
    record = logging.makeLogRecord({"msg": message, "levelname": "INFO", "name": "x"})
    for formatter in (TextFormatter(), JsonFormatter()):
        out = formatter.format(record)
        for secret in ("abc", "t0k", "eyJhbGc", "hunter2", "tok-1", '"pw"'):
            assert secret not in out, (secret, out)
        assert "https://hooks.example/p?<redacted>" in out.replace("\\", "")
    assert redact("GET /v1/probes 200") == "GET /v1/probes 200"


def test_the_log_format_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMBUDGET_LOG_FORMAT", "json")
    config = logging_config()
    assert config.formatters["standard"]["()"].endswith("JsonFormatter")
    assert config.log_exceptions == "never"  # the problem handlers log 5xx themselves
    monkeypatch.setenv("VRAMBUDGET_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="VRAMBUDGET_LOG_FORMAT"):
        logging_config()


@pytest.mark.parametrize(
    "media",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_body_that_is_not_json_is_415_before_any_handler(client: Any, media: str) -> None:
    r = client.post("/echo", content=b'{"a": 1}', headers={"Content-Type": media})
    assert r.status_code == 415
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["status"] == 415 and r.headers["x-request-id"]


@pytest.mark.parametrize(
    "media", [None, "application/json", "application/json; charset=utf-8", "application/x+json"]
)
def test_json_or_no_content_type_is_read(client: Any, media: str | None) -> None:
    headers = {"Content-Type": media} if media else {}
    r = client.post("/echo", content=b'{"a": 1}', headers=headers)
    assert r.status_code == 200 and r.json() == {"a": 1}


def test_integers_beyond_2_53_are_flagged_in_a_header(client: Any) -> None:
    r = client.get("/big")
    assert r.headers["x-unsafe-integers"] == "2"  # 2^53 + 1 and 2^60; not the string
    r = client.post("/echo", content=b'{"a": 9007199254740992}')
    assert "x-unsafe-integers" not in r.headers
    assert unsafe_integers(b'{"a":-90071992547409930,"b":1.12345678901234567}') == 1
