"""The embeddable fit table (docs/EMBED.md) in a real headless Chromium against a real
``vrambudget serve`` on 127.0.0.1: the page ``/ui/fits`` turns its query into the FitRequest
written here by hand, the table shows exactly the live ``/v1/fits`` answer for it (verdict, free
or missing bytes, limiting component, maxima), its columns sort by click and by keyboard with
``aria-sort``, a bad workload shows the 422's field and allowed range, and the element works
from a page of another origin (the module loads; the call succeeds when the service's CORS
setting allows that origin, else the element says so). Every wait is bounded."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal, localcontext
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support import browser
from tests.support.processes import Service, free_port

WAIT_S = 60  # the first fit starts the service's compute worker (about a second here)

GIB, MIB = 2**30, 2**20

#: The element's words for a layout's verdict and for the components (checked against
#: ``COMPONENT_LABELS`` of the module in tests/service/test_ui.py).
VERDICT = {"fits": "Fits", "fits_if_low": "Only if low", "does_not_fit": "Does not fit"}
LABEL = {
    "weights": "Weights",
    "kv_cache": "KV cache",
    "activations": "Activations",
    "logits": "Logits",
    "optimizer_state": "Optimizer state",
    "gradients": "Gradients",
}
FIXED_COLUMNS = ["gpu", "devices", "verdict", "free", "needed", "limiting"]
MAXIMA_ORDER = [
    "batch_size",
    "context_tokens",
    "concurrent_requests",
    "max_model_len",
    "max_concurrency",
    "n_gpu_layers",
    "file_type",
]

# One table's state as the browser shows it: per cell the text a reader sees first (without
# the sub-lines, tags, notes and icons), the raw value the cell was drawn from, and the rest.
_READ = """
const root = document.querySelector(arguments[0]).shadowRoot;
const main = (cell) => {
  const c = cell.cloneNode(true);
  const extra = 'details, .sub, .tag, .sr-only, [aria-hidden="true"]:not(.dash)';
  c.querySelectorAll(extra).forEach(n => n.remove());
  return c.textContent.trim();
};
const table = root.querySelector('table');
return {
  hidden: table.hidden,
  caption: root.querySelector('caption').textContent,
  status: root.querySelector('[role=status]').textContent,
  live: root.querySelector('[role=status]').getAttribute('aria-live'),
  error: root.querySelector('[role=alert]').textContent,
  fields: [...root.querySelectorAll('[role=alert] li[data-field]')].map(
    li => [li.dataset.field, li.textContent]),
  headers: [...table.querySelectorAll('thead th')].map(th => ({
    key: th.dataset.key, scope: th.scope, sort: th.getAttribute('aria-sort'),
    label: th.querySelector('button > span').firstChild.textContent})),
  rows: [...table.querySelectorAll('tbody tr')].map(tr => ({
    gpu: tr.dataset.gpuId, count: Number(tr.dataset.deviceCount),
    cells: [...tr.cells].map(c => ({
      key: c.dataset.key, text: main(c), value: c.dataset.value, tag: c.tagName, scope: c.scope,
      subs: [...c.querySelectorAll('.sub, .tag')].map(s => s.textContent),
      notes: c.querySelectorAll('details p').length}))})),
};
"""
_DONE = """
const host = document.querySelector(arguments[0]);
if (!host || !host.shadowRoot) return false;
const root = host.shadowRoot;
return (host.response !== null && !root.querySelector('table').hasAttribute('aria-busy'))
  || root.querySelector('[role=alert]').childElementCount > 0;
"""


def _fixed(value: Decimal | float | int, digits: int) -> str:
    """Intl.NumberFormat('en') with ``digits`` decimals: the exact value, halves away from
    zero (ECMA-402's default rounding), thousands separated by commas."""
    with localcontext() as ctx:
        ctx.prec = 80
        q = Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{q:,.{digits}f}"


def _size(n: int) -> str:
    """The element's bytes: GiB with 2 decimals, MiB with 1 below a GiB, else bytes."""
    a = abs(n)
    with localcontext() as ctx:
        ctx.prec = 80
        if a >= GIB:
            return f"{_fixed(Decimal(a) / GIB, 2)} GiB"
        if a >= MIB:
            return f"{_fixed(Decimal(a) / MIB, 1)} MiB"
    return f"{a:,} B"


def _maximum(key: str, value: Any) -> str:
    """A maximum as the element writes it (absent or null: a dash)."""
    if value is None:
        return "—"
    if key == "file_type":
        return str(value)
    return _fixed(value, 2 if key == "max_concurrency" else 0)


def _verdict(layout: dict[str, Any]) -> str:
    """The "Fits?" column: the verdict, but never "fits" where the total with the requested
    headroom exceeds the capacity."""
    verdict: str = layout["verdict"]
    return "does_not_fit" if verdict == "fits" and not layout["fits"] else verdict


def _expected_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per GPU type and layout; a GPU type without a layout has one row of its own."""
    rows: list[dict[str, Any]] = []
    for g in answer["gpus"]:
        for layout in g["layouts"] or [None]:
            rows.append({"gpu": g, "layout": layout, "index": len(rows)})
    return rows


def _expected_columns(answer: dict[str, Any]) -> list[str]:
    present = {
        k
        for g in answer["gpus"]
        for layout in g["layouts"]
        for k, v in layout["maxima"].items()
        if v is not None and k != "context_limited_by_model"
    }
    return FIXED_COLUMNS + [k for k in MAXIMA_ORDER if k in present]


def _check_rendered(
    shown: dict[str, Any], answer: dict[str, Any], columns: list[str] | None = None
) -> None:
    """Every row and cell of the table against the service's answer (``columns``: those the
    element was asked for; default all of them)."""
    expected = _expected_rows(answer)
    columns = columns or _expected_columns(answer)
    assert not shown["hidden"] and shown["error"] == ""
    assert [h["key"] for h in shown["headers"]] == columns
    assert all(h["scope"] == "col" for h in shown["headers"])
    assert len(shown["rows"]) == len(expected)
    verdicts = [_verdict(r["layout"]) for r in expected if r["layout"] is not None]
    n_gpus, n_layouts = len(answer["gpus"]), len(verdicts)
    assert shown["live"] == "polite"
    assert shown["status"] == (
        f"{n_gpus} GPU types, {n_layouts} layouts: {verdicts.count('fits')} fit, "
        f"{verdicts.count('fits_if_low')} only if low, {verdicts.count('does_not_fit')} do not fit."
    )
    for row, want in zip(shown["rows"], expected, strict=True):
        g, layout = want["gpu"], want["layout"]
        assert [c["key"] for c in row["cells"]] == columns  # (WebDriver sorts object keys)
        cells = {c["key"]: c for c in row["cells"]}
        if "gpu" in cells:
            assert cells["gpu"]["tag"] == "TH" and cells["gpu"]["scope"] == "row"
            assert cells["gpu"]["text"] == g["name"]
            assert cells["gpu"]["subs"] == [f"{g['gpu_id']} · {_size(g['memory_total_bytes'])}"]
        if layout is None:  # no valid layout at the requested counts: said once, dashes elsewhere
            assert row["gpu"] == g["gpu_id"]
            assert cells["verdict"]["text"] == "No layout"
            assert {cells[k]["text"] for k in columns if k not in ("gpu", "verdict")} == {"—"}
            continue
        assert (row["gpu"], row["count"]) == (g["gpu_id"], layout["device_count"])
        if "devices" in cells:
            assert cells["devices"]["value"] == str(layout["device_count"])
            fewest = g["min_device_count"] == layout["device_count"]
            assert ("fewest that fit" in cells["devices"]["subs"]) == fewest
        if "verdict" in cells:
            assert cells["verdict"]["value"] == _verdict(layout)
            assert cells["verdict"]["text"] == VERDICT[_verdict(layout)]
            assert cells["verdict"]["notes"] == len(layout["warnings"])
        free = layout["free_bytes"]
        if "free" in cells:
            assert cells["free"]["value"] == str(free)
            assert cells["free"]["text"] == f"{_size(free)} {'free' if free >= 0 else 'short'}"
        if "needed" in cells:
            assert cells["needed"]["value"] == str(layout["total_bytes"])
            assert cells["needed"]["text"] == _size(layout["total_bytes"])
        if "limiting" in cells:
            assert cells["limiting"]["value"] == layout["limiting_component"]
            assert cells["limiting"]["text"] == LABEL[layout["limiting_component"]]
        for key in [c for c in columns if c in MAXIMA_ORDER]:
            value = layout["maxima"].get(key)
            assert cells[key]["text"] == _maximum(key, value), (key, value, cells[key])
            if value is None:
                assert cells[key]["value"] == ""
            elif key == "file_type":
                assert cells[key]["value"] == value
            else:
                assert float(cells[key]["value"]) == value
            if key == "context_tokens":
                limited = layout["maxima"].get("context_limited_by_model", False)
                assert ("model max" in cells[key]["subs"]) == limited


# ------------------------------------------------------------------------------ fixtures ----


class _Page(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def catalog_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Another origin (``localhost`` vs the service's ``127.0.0.1``): a catalog page's server."""
    root = tmp_path_factory.mktemp("catalog")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Page, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def service(catalog_site: tuple[str, Path]) -> Iterator[str]:
    svc = Service(
        free_port(), VRAMBUDGET_COMPUTE_WORKERS="1", VRAMBUDGET_CORS_ORIGINS=catalog_site[0]
    )
    svc.start()
    try:
        yield svc.url
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    absent = browser.missing()
    if absent is not None:
        reason = browser.cannot_install()
        if reason is not None:
            pytest.skip(f"{absent}, and {reason}")
        pytest.fail(
            f"{absent}: scripts/_browser.sh installs it with apt-get (scripts/test sources it;"
            " its log is /tmp/vrambudget-browser-install.log)"
        )
    with browser.chromium(tmp_path_factory.mktemp("chromium-profile")) as d:
        yield d


def _open(driver: WebDriver, url: str, selector: str = "vrambudget-fits") -> dict[str, Any]:
    driver.get(url)
    WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
        lambda d: d.execute_script(_DONE, selector)
    )
    shown: dict[str, Any] = driver.execute_script(_READ, selector)
    return shown


def _fits(service: str, request: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{service}/v1/fits", json=request, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _sent(driver: WebDriver) -> dict[str, Any]:
    request: dict[str, Any] = driver.execute_script(
        "return document.querySelector('vrambudget-fits').request"
    )
    return request


# --------------------------------------------------------------------------------- tests ----

GPUS = ["h100-sxm5-80gb", "l40s-48gb", "a100-sxm4-40gb"]
INFERENCE_QUERY = (
    "model=llama-3.1-70b&kind=inference&batch=4&prompt=2048&generate=256&counts=1,2,4"
    f"&gpus={','.join(GPUS)}"
)
INFERENCE_REQUEST = {
    "workloads": [
        {
            "kind": "inference",
            "model": {"source": "preset", "id": "llama-3.1-70b"},
            "batch_size": 4,
            "prompt_tokens": 2048,
            "generated_tokens": 256,
        }
    ],
    "device_counts": [1, 2, 4],
    "devices": [{"source": "catalog", "id": g} for g in GPUS],
}


def test_the_page_shows_the_live_fit_answer(driver: WebDriver, service: str) -> None:
    shown = _open(driver, f"{service}/ui/fits?{INFERENCE_QUERY}")
    assert _sent(driver) == INFERENCE_REQUEST
    answer = _fits(service, INFERENCE_REQUEST)
    # a table worth checking: every verdict and both signs of free memory occur
    verdicts = {_verdict(layout) for g in answer["gpus"] for layout in g["layouts"]}
    assert verdicts == {"fits", "fits_if_low", "does_not_fit"}, verdicts
    _check_rendered(shown, answer)
    assert shown["caption"] == (
        "Fits of llama-3.1-70b (inference: batch 4, 2,048-token prompt, 256 generated) "
        "per GPU type and GPU count"
    )
    assert [h["sort"] for h in shown["headers"]] == [None] * len(shown["headers"])
    # themable: a custom property set on the element reaches inside its shadow root
    color = driver.execute_script(
        "const host = document.querySelector('vrambudget-fits');"
        "host.style.setProperty('--vrambudget-fits-color', 'rgb(1, 2, 3)');"
        "return getComputedStyle(host.shadowRoot.querySelector('.verdict-fits')).color"
    )
    assert color == "rgb(1, 2, 3)"
    # the form shows the query it came from
    assert driver.find_element(By.ID, "batch").get_attribute("value") == "4"
    assert driver.find_element(By.ID, "model").get_attribute("value") == "llama-3.1-70b"


def test_a_serving_workload_shows_the_engine_maxima(driver: WebDriver, service: str) -> None:
    gpus = ["h100-sxm5-80gb", "rtx-4080-16gb"]
    shown = _open(
        driver,
        f"{service}/ui/fits?kind=llm_serving&model=llama-3.1-8b&counts=1,2&gpus={','.join(gpus)}",
    )
    request = {
        "workloads": [{"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-8b"}}],
        "device_counts": [1, 2],
        "devices": [{"source": "catalog", "id": g} for g in gpus],
    }
    assert _sent(driver) == request
    answer = _fits(service, request)
    assert {"max_model_len", "max_concurrency"} <= set(_expected_columns(answer))
    # the engine does not start on one RTX 4080: the row says so, and why
    small = answer["gpus"][1]["layouts"][0]
    assert not small["fits"] and small["verdict"] == "does_not_fit" and small["warnings"], small
    _check_rendered(shown, answer)


GENERIC = {
    "kind": "generic",
    "name": "cycles-4k",
    "assets": [{"name": "scene geometry + BVH", "bytes": 6442450944}],
    "per_item": [{"name": "beauty + denoise passes", "bytes": 265420800}],
}


@pytest.mark.parametrize("counts", [[1, 2], [2]])
def test_a_workload_given_as_json_and_gpus_without_a_layout(
    driver: WebDriver, service: str, counts: list[int]
) -> None:
    """The page's ``workload`` parameter is sent as it is; a generic workload has a layout on
    one device only, so at 2 devices every GPU type is a row saying so."""
    gpus = ["l4-24gb", "rtx-4080-16gb"]
    query = urlencode(
        {
            "workload": json.dumps(GENERIC),
            "counts": ",".join(map(str, counts)),
            "gpus": ",".join(gpus),
        }
    )
    shown = _open(driver, f"{service}/ui/fits?{query}")
    request = {
        "workloads": [GENERIC],
        "device_counts": counts,
        "devices": [{"source": "catalog", "id": g} for g in gpus],
    }
    assert _sent(driver) == request
    # the fields the JSON replaces are disabled; the GPU counts and GPUs still apply
    assert not driver.find_element(By.ID, "model").is_enabled()
    assert driver.find_element(By.ID, "counts").is_enabled()
    answer = _fits(service, request)
    assert all(bool(g["layouts"]) == (1 in counts) for g in answer["gpus"])
    if 1 in counts:
        assert _expected_columns(answer) == [*FIXED_COLUMNS, "batch_size"]
        _check_rendered(shown, answer)
    else:
        _check_rendered(shown, answer, FIXED_COLUMNS)
        assert shown["status"] == "2 GPU types, 0 layouts: 0 fit, 0 only if low, 0 do not fit."


def test_the_form_changes_the_workload(driver: WebDriver, service: str) -> None:
    """Choose training, type a batch and a sequence length, submit: the query and the table
    follow, and the fields of the other kinds are hidden."""
    _open(driver, f"{service}/ui/fits?model=qwen2.5-7b&counts=1,2&gpus=h100-sxm5-80gb,l4-24gb")
    Select(driver.find_element(By.ID, "kind")).select_by_value("training")
    assert not driver.find_element(By.ID, "prompt").is_displayed()
    driver.find_element(By.ID, "batch").send_keys("2")
    driver.find_element(By.ID, "seq").send_keys("4096")
    Select(driver.find_element(By.ID, "method")).select_by_value("lora")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    request = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": "qwen2.5-7b"},
                "micro_batch_size": 2,
                "sequence_length": 4096,
                "method": {"kind": "lora"},
            }
        ],
        "device_counts": [1, 2],
        "devices": [{"source": "catalog", "id": g} for g in ("h100-sxm5-80gb", "l4-24gb")],
    }
    WebDriverWait(driver, WAIT_S).until(lambda d: _sent(d) == request)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: (
            d.execute_script(_DONE, "vrambudget-fits")
            and "training" in d.execute_script(_READ, "vrambudget-fits")["caption"]
        )
    )
    assert driver.current_url == (
        f"{service}/ui/fits?model=qwen2.5-7b&kind=training&batch=2&seq=4096&method=lora"
        "&counts=1%2C2&gpus=h100-sxm5-80gb%2Cl4-24gb"
    )
    _check_rendered(driver.execute_script(_READ, "vrambudget-fits"), _fits(service, request))


def _header(driver: WebDriver, key: str) -> Any:
    host = driver.find_element(By.CSS_SELECTOR, "vrambudget-fits")
    return host.shadow_root.find_element(By.CSS_SELECTOR, f'thead button[data-key="{key}"]')


def _order(shown: dict[str, Any]) -> list[tuple[str, int]]:
    return [(r["gpu"], r["count"]) for r in shown["rows"]]


def test_columns_sort_by_click_and_by_keyboard(driver: WebDriver, service: str) -> None:
    shown = _open(driver, f"{service}/ui/fits?{INFERENCE_QUERY}")
    rows = _expected_rows(_fits(service, INFERENCE_REQUEST))
    key = {(r["gpu"]["gpu_id"], r["layout"]["device_count"]): r for r in rows}
    assert set(_order(shown)) == set(key)

    def sorted_by(field: str, descending: bool) -> list[tuple[str, int]]:
        sign = -1 if descending else 1
        ordered = sorted(rows, key=lambda r: (sign * r["layout"][field], r["index"]))
        return [(r["gpu"]["gpu_id"], r["layout"]["device_count"]) for r in ordered]

    def sort_state(shown: dict[str, Any]) -> dict[str, str]:
        return {h["key"]: h["sort"] for h in shown["headers"] if h["sort"] is not None}

    _header(driver, "free").click()
    shown = driver.execute_script(_READ, "vrambudget-fits")
    assert sort_state(shown) == {"free": "ascending"}
    assert _order(shown) == sorted_by("free_bytes", descending=False)
    assert shown["status"].endswith("Sorted by Free, ascending.")
    _header(driver, "free").click()
    shown = driver.execute_script(_READ, "vrambudget-fits")
    assert sort_state(shown) == {"free": "descending"}
    assert _order(shown) == sorted_by("free_bytes", descending=True)

    # keyboard: Enter on the focused header button, then Space
    _header(driver, "needed").send_keys(Keys.ENTER)
    shown = driver.execute_script(_READ, "vrambudget-fits")
    assert sort_state(shown) == {"needed": "ascending"}
    assert _order(shown) == sorted_by("total_bytes", descending=False)
    focused = driver.execute_script(
        "return document.querySelector('vrambudget-fits').shadowRoot.activeElement.dataset.key"
    )
    assert focused == "needed"  # sorting keeps the focus on the header button
    _header(driver, "needed").send_keys(Keys.SPACE)
    shown = driver.execute_script(_READ, "vrambudget-fits")
    assert sort_state(shown) == {"needed": "descending"}
    assert _order(shown) == sorted_by("total_bytes", descending=True)
    # Tab from the header button reaches the next one
    ActionChains(driver).send_keys(Keys.TAB).perform()
    focused = driver.execute_script(
        "return document.querySelector('vrambudget-fits').shadowRoot.activeElement.dataset.key"
    )
    assert focused == "limiting"


@pytest.mark.parametrize(
    ("query", "request_part", "field", "input_id"),
    [
        ("batch=0", {"batch_size": 0}, "$.workloads[0].batch_size", "batch"),
        (
            "kind=training&seq=abc",
            {"sequence_length": "abc"},
            "$.workloads[0].sequence_length",
            "seq",
        ),
    ],
)
def test_a_bad_workload_shows_the_field_and_its_range(
    driver: WebDriver,
    service: str,
    query: str,
    request_part: dict[str, Any],
    field: str,
    input_id: str,
) -> None:
    shown = _open(driver, f"{service}/ui/fits?{query}")
    sent = _sent(driver)
    assert sent["workloads"][0].items() >= request_part.items()
    r = httpx.post(f"{service}/v1/fits", json=sent, timeout=WAIT_S)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert [e["field"] for e in problem["errors"]] == [field]
    assert shown["hidden"]
    assert shown["fields"] == [
        [e["field"], f"{e['field']}: {e['message']}"] for e in problem["errors"]
    ]
    assert "allowed range" in shown["fields"][0][1]
    assert "Invalid request (422)" in shown["error"]
    invalid = driver.find_element(By.ID, input_id).get_attribute("aria-invalid")
    assert invalid == "true"


def test_the_columns_attribute_picks_and_orders_the_columns(
    driver: WebDriver, service: str
) -> None:
    driver.get(f"{service}/ui/fits?{INFERENCE_QUERY}")
    add = (
        "const t = document.createElement('vrambudget-fits'); t.id = arguments[0];"
        "t.setAttribute('workload', JSON.stringify(arguments[1]));"
        "t.setAttribute('device-counts', '1,2,4'); t.setAttribute('gpus', arguments[2]);"
        "t.setAttribute('columns', arguments[3]); document.body.append(t);"
    )
    workload, gpus = INFERENCE_REQUEST["workloads"][0], ",".join(GPUS)  # type: ignore[index]
    chosen = ["verdict", "gpu", "devices", "batch_size", "free"]
    driver.execute_script(add, "narrow", workload, gpus, ", ".join(chosen))
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(_DONE, "#narrow"))
    shown = driver.execute_script(_READ, "#narrow")
    _check_rendered(shown, _fits(service, INFERENCE_REQUEST), chosen)
    # an unknown column is refused, naming the allowed ones
    driver.execute_script(add, "wrong", workload, gpus, "gpu,speed")
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(_DONE, "#wrong"))
    shown = driver.execute_script(_READ, "#wrong")
    assert shown["hidden"]
    assert (
        "the columns attribute names 'speed'; allowed: gpu, devices, verdict, free"
        in (shown["error"])
    )


def test_the_element_on_a_catalog_page_of_another_origin(
    driver: WebDriver, service: str, catalog_site: tuple[str, Path]
) -> None:
    origin, root = catalog_site
    workload = '{"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-7b"}}'
    (root / "catalog.html").write_text(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<script type="module" src="{service}/ui/vrambudget-fits.js"></script></head>'
        "<body><h1>Our GPUs</h1>"
        f"<vrambudget-fits workload='{workload}' gpus='h100-sxm5-80gb, l4-24gb' "
        "device-counts='1' caption='Qwen 2.5 7B on our GPUs'></vrambudget-fits></body></html>"
    )
    shown = _open(driver, f"{origin}/catalog.html")
    # the module loaded from the service's origin (it is served to any origin)
    assert driver.execute_script("return customElements.get('vrambudget-fits') !== undefined")
    preflight = httpx.options(
        f"{service}/v1/fits",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    allowed = preflight.headers.get("access-control-allow-origin") in (origin, "*")
    if not allowed:  # a service without a CORS setting: the element says what is wrong
        assert shown["hidden"]
        assert f"Could not reach the vrambudget service at {service}/v1/fits" in shown["error"]
        assert "CORS" in shown["error"]
        return
    request = {
        "workloads": [{"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-7b"}}],
        "device_counts": [1],
        "devices": [{"source": "catalog", "id": g} for g in ("h100-sxm5-80gb", "l4-24gb")],
    }
    _check_rendered(shown, _fits(service, request))
    assert shown["caption"] == "Qwen 2.5 7B on our GPUs"


def test_the_browser_tests_run_where_the_browser_can_be_installed() -> None:
    """CI (root, apt-get) never skips the browser: scripts/_browser.sh installed it."""
    if os.environ.get("CI") and browser.cannot_install() is None:
        assert browser.missing() is None
