// <vrambudget-fits>: will this workload fit, per GPU and GPU count. A custom element that asks a
// vrambudget service's `POST /v1/fits` and shows the answer as a sortable, accessible table.
// Plain ES module: no framework, no build step, nothing loaded from elsewhere. docs/EMBED.md
// describes the attributes, events, styling and every column.
//
//   <script type="module" src="https://vram.example.com/ui/vrambudget-fits.js"></script>
//   <vrambudget-fits workload='{"kind": "inference",
//                               "model": {"source": "preset", "id": "llama-3.1-8b"}}'>
//   </vrambudget-fits>

const GIB = 2 ** 30;
const MIB = 2 ** 20;
const TIMEOUT_MS = 120_000;
const DEFAULT_DEVICE_COUNTS = [1, 2, 4, 8];

/** The budget components as people call them (vrambudget.core.components.Component). */
export const COMPONENT_LABELS = Object.freeze({
  weights: "Weights",
  quantization_metadata: "Quantization metadata",
  adapters: "Adapters",
  kv_cache: "KV cache",
  activations: "Activations",
  logits: "Logits",
  gradients: "Gradients",
  optimizer_state: "Optimizer state",
  master_weights: "Master weights",
  cuda_context: "CUDA context",
  runtime_workspace: "Runtime workspace",
  communication_buffers: "Communication buffers",
  allocator_overhead: "Allocator overhead",
  headroom: "Headroom",
});

/** A layout's `verdict` in words, with its sort rank (fits first). */
export const VERDICTS = Object.freeze({
  fits: { text: "Fits", icon: "✓", rank: 0 },
  fits_if_low: { text: "Only if low", icon: "≈", rank: 1 },
  does_not_fit: { text: "Does not fit", icon: "✗", rank: 2 },
});
const NO_LAYOUT = { text: "No layout", icon: "–", rank: 3 };

/** What the "Fits?" column shows for a layout: its `verdict` (against the error band), except
 * that a layout whose total with the requested headroom exceeds the capacity (`fits` false)
 * never shows "fits". */
export function verdictOf(layout) {
  return layout.verdict === "fits" && layout.fits === false ? "does_not_fit" : layout.verdict;
}

/** The maxima a fit may solve (`layouts[].maxima`); a column appears when any row has one. */
const MAXIMA = [
  {
    key: "batch_size",
    label: "Max batch",
    help: "Largest batch size that fits with everything else unchanged (0: not even 1).",
  },
  {
    key: "context_tokens",
    label: "Max context",
    unit: "tokens",
    help: "Largest context (prompt + generated tokens) that fits; “model max”: the model's own limit stopped the search.",
  },
  {
    key: "concurrent_requests",
    label: "Max concurrent",
    unit: "requests",
    help: "Most requests in flight at once that fit.",
  },
  {
    key: "max_model_len",
    label: "Max model length",
    unit: "tokens",
    help: "Serving: the largest max_model_len at which the engine starts.",
  },
  {
    key: "max_concurrency",
    label: "Max concurrency",
    unit: "sequences",
    digits: 2,
    help: "Serving: sequences of the full max_model_len the engine's KV cache holds at once.",
  },
  {
    key: "n_gpu_layers",
    label: "GPU layers",
    help: "llama.cpp / Ollama: the most layers that fit on the GPUs.",
  },
  {
    key: "file_type",
    label: "Largest GGUF type",
    text: true,
    help: "llama.cpp / Ollama: the largest GGUF quantization that fits whole on the GPUs.",
  },
];

const STYLE = `
:host {
  display: block;
  font-family: var(--vrambudget-font, inherit);
  font-size: var(--vrambudget-font-size, 0.9375rem);
  color: var(--vrambudget-color, inherit);
  background: var(--vrambudget-background, transparent);
}
:host([hidden]) { display: none; }
.title { margin: 0 0 0.2em; font-weight: 600; }
.title:empty { display: none; }
.status { margin: 0 0 0.5em; min-height: 1.4em; color: var(--vrambudget-muted-color, #57606a); }
.error:empty { display: none; }
.error {
  margin: 0 0 0.75em;
  padding: 0.6em 0.8em;
  border: 1px solid var(--vrambudget-no-color, #cf222e);
  border-left-width: 4px;
  border-radius: var(--vrambudget-radius, 6px);
  color: var(--vrambudget-color, inherit);
}
.error p { margin: 0 0 0.3em; }
.error ul { margin: 0.2em 0 0; padding-left: 1.2em; }
.error code { font-weight: 600; }
.scroll { overflow-x: auto; }
.scroll:focus-visible { outline: 2px solid var(--vrambudget-accent, #0969da); outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table[hidden] { display: none; }
th, td {
  padding: 0.4em 0.5em;
  border-bottom: 1px solid var(--vrambudget-border-color, #d0d7de);
  text-align: start;
  vertical-align: top;
}
thead th {
  background: var(--vrambudget-header-background, #f6f8fa);
  border-bottom-width: 2px;
  padding: 0;
  white-space: nowrap;
  vertical-align: bottom;
}
tbody tr:nth-child(even) { background: var(--vrambudget-stripe-background, transparent); }
tbody th { font-weight: 600; min-width: 10em; }
tbody th .sub { font-weight: 400; }
.nowrap { white-space: nowrap; }
.num { text-align: end; white-space: nowrap; }
thead th.num button { justify-content: flex-end; text-align: end; }
thead button {
  all: inherit;
  box-sizing: border-box;
  display: flex;
  align-items: baseline;
  gap: 0.3em;
  width: 100%;
  padding: 0.45em 0.5em;
  cursor: pointer;
  font-weight: 600;
  white-space: normal;
}
thead button:hover { text-decoration: underline; }
thead button:focus-visible { outline: 2px solid var(--vrambudget-accent, #0969da); outline-offset: -2px; }
.unit { font-weight: 400; color: var(--vrambudget-muted-color, #57606a); }
.arrow { color: var(--vrambudget-accent, #0969da); min-width: 0.8em; }
.arrow.unsorted { color: var(--vrambudget-muted-color, #8c959f); font-weight: 400; }
.sub { display: block; font-size: 0.85em; color: var(--vrambudget-muted-color, #57606a); }
.tag {
  display: block;
  width: max-content;
  margin: 0.15em 0 0 auto;
  padding: 0 0.4em;
  border-radius: 1em;
  font-size: 0.75em;
  border: 1px solid var(--vrambudget-fits-color, #1a7f37);
  color: var(--vrambudget-fits-color, #1a7f37);
}
.verdict { font-weight: 600; white-space: nowrap; }
.verdict-fits { color: var(--vrambudget-fits-color, #1a7f37); }
.verdict-fits_if_low { color: var(--vrambudget-low-color, #9a6700); }
.verdict-does_not_fit, .verdict-none { color: var(--vrambudget-no-color, #cf222e); }
.short { color: var(--vrambudget-no-color, #cf222e); }
details { font-size: 0.85em; font-weight: 400; color: var(--vrambudget-color, inherit); white-space: normal; max-width: 28em; }
summary { cursor: pointer; color: var(--vrambudget-muted-color, #57606a); }
summary:focus-visible { outline: 2px solid var(--vrambudget-accent, #0969da); }
.notes { font-size: 0.875em; color: var(--vrambudget-muted-color, #57606a); }
.notes:empty { display: none; }
.notes ul { margin: 0.5em 0 0; padding-left: 1.2em; }
.sr-only, caption {
  position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px;
  overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0;
}
`;

/** An attribute the element cannot use (bad JSON, nothing to fit): the error names it. */
class AttributeError extends Error {
  constructor(attribute, message) {
    super(message);
    this.attribute = attribute;
  }
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "className") node.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "part" || k === "role")
      node.setAttribute(k, v === true ? "" : String(v));
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) node.append(c);
  return node;
}

function parseJSON(attribute, text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new AttributeError(attribute, `the ${attribute} attribute is not valid JSON (${e.message})`);
  }
}

/** "1, 2,4" -> [1, 2, 4]; a token that is not a whole number stays a string for the service
 * to refuse with the field and the allowed range. */
export function listOfCounts(text) {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .map((s) => (/^-?\d+$/.test(s) ? Number(s) : s));
}

function fixed(lang, value, digits) {
  return new Intl.NumberFormat(lang, {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  }).format(value);
}

/** Bytes for people: GiB (2^30) with 2 decimals, MiB below 1 GiB, bytes below 1 MiB. */
export function formatBytes(bytes, lang = "en") {
  const a = Math.abs(bytes);
  if (a >= GIB) return `${fixed(lang, a / GIB, 2)} GiB`;
  if (a >= MIB) return `${fixed(lang, a / MIB, 1)} MiB`;
  return `${fixed(lang, a, 0)} B`;
}

function sentence(text) {
  const t = String(text).trim();
  return /[.!?]$/.test(t) ? t : `${t}.`;
}

function componentLabel(key) {
  return COMPONENT_LABELS[key] ?? String(key).replaceAll("_", " ");
}

function modelLabel(model) {
  if (!model || typeof model !== "object") return "a model";
  return model.id ?? model.name ?? (model.source === "dimensions" ? "a model by its dimensions" : "a model");
}

/** The caption's words for a fit request. */
export function describe(request, lang = "en") {
  const ws = Array.isArray(request?.workloads) ? request.workloads : [];
  const w = ws[0];
  if (!w || typeof w !== "object") return "Fits per GPU and GPU count";
  const n = (v) => (typeof v === "number" ? fixed(lang, v, 0) : String(v));
  const name = w.name ?? modelLabel(w.model);
  const parts = [];
  let kind;
  if (w.kind === "training") {
    const method = w.method?.kind ?? "full";
    kind = method === "full" ? "training, full fine-tune" : `training, ${method}`;
    if (w.micro_batch_size !== undefined) parts.push(`micro-batch ${n(w.micro_batch_size)}`);
    if (w.sequence_length !== undefined) parts.push(`${n(w.sequence_length)}-token sequences`);
  } else if (w.kind === "llm_serving") {
    kind = `served with ${w.engine ?? "vllm"}`;
    if (w.max_model_len !== undefined) parts.push(`max model length ${n(w.max_model_len)}`);
  } else if (w.kind === "inference" || w.kind === undefined) {
    kind = "inference";
    if (w.batch_size !== undefined) parts.push(`batch ${n(w.batch_size)}`);
    if (w.prompt_tokens !== undefined) parts.push(`${n(w.prompt_tokens)}-token prompt`);
    if (w.generated_tokens !== undefined) parts.push(`${n(w.generated_tokens)} generated`);
  } else {
    kind = String(w.kind).replaceAll("_", " ");
  }
  if (ws.length > 1) parts.push(`+ ${ws.length - 1} co-located`);
  const what = parts.length ? `${kind}: ${parts.join(", ")}` : kind;
  return `Fits of ${name} (${what}) per GPU type and GPU count`;
}

/** One table row: a GPU type at one device count (or a GPU type with no valid layout). */
function rowsOf(response) {
  const rows = [];
  for (const gpu of response.gpus ?? []) {
    const layouts = gpu.layouts ?? [];
    if (layouts.length === 0) rows.push({ gpu, layout: null, index: rows.length });
    for (const layout of layouts) rows.push({ gpu, layout, index: rows.length });
  }
  return rows;
}

function dash(srText) {
  return [el("span", { className: "dash", "aria-hidden": "true", text: "—" }), el("span", { className: "sr-only", text: srText })];
}

/** The table's columns: the fixed ones, then the maxima the answer has. */
function columns(rows, lang) {
  const cols = [
    {
      key: "gpu",
      label: "GPU",
      help: "The GPU type: its catalog id and the memory of one GPU as the CUDA or HIP runtime reports it.",
      header: true,
      sort: (r) => r.gpu.name,
      cell: (r) => {
        const memory = formatBytes(r.gpu.memory_total_bytes, lang);
        // wraps between the id and the memory, never inside either
        const sub = el("span", { className: "sub" });
        if (r.gpu.gpu_id) sub.append(el("span", { className: "nowrap", text: r.gpu.gpu_id }), " · ");
        sub.append(el("span", { className: "nowrap", text: memory }));
        return { value: r.gpu.gpu_id ?? r.gpu.name, content: [r.gpu.name, sub] };
      },
    },
    {
      key: "devices",
      label: "GPUs",
      numeric: true,
      help: "GPUs per replica, and their layout: tensor (TP), pipeline (PP), data (DP) parallel.",
      sort: (r) => r.layout?.device_count ?? null,
      cell: (r) => {
        if (!r.layout) return { value: "", content: dash("no valid layout") };
        const l = r.layout;
        const layout = [];
        if (l.tensor > 1) layout.push(`TP ${l.tensor}`);
        if (l.pipeline > 1) layout.push(`PP ${l.pipeline}`);
        if (l.data > 1) layout.push(`DP ${l.data}`);
        const fewest = r.gpu.min_device_count === l.device_count;
        return {
          value: l.device_count,
          content: [
            String(l.device_count),
            layout.length ? el("span", { className: "sub", text: layout.join(" × ") }) : null,
            fewest ? el("span", { className: "tag", text: "fewest that fit" }) : null,
          ],
        };
      },
    },
    {
      key: "verdict",
      label: "Fits?",
      help: "Fits: the budget fits, up to its error band's high end. Only if low: the budget with its headroom does not fit (or its band's high end does not); it fits only if the real peak lands near the band's low end. Does not fit: not even the low end fits.",
      sort: (r) => (r.layout ? (VERDICTS[verdictOf(r.layout)] ?? NO_LAYOUT).rank : NO_LAYOUT.rank),
      cell: (r) => {
        const key = r.layout ? verdictOf(r.layout) : "none";
        const v = r.layout ? (VERDICTS[key] ?? { text: key, icon: "?" }) : NO_LAYOUT;
        const warnings = r.layout?.warnings ?? [];
        const notes = warnings.length
          ? el(
              "details",
              {},
              el("summary", { text: warnings.length === 1 ? "1 note" : `${warnings.length} notes` }),
              ...warnings.map((w) => el("p", { text: w })),
            )
          : null;
        return {
          value: r.layout ? key : "",
          content: [
            el(
              "span",
              { className: `verdict verdict-${key}` },
              el("span", { "aria-hidden": "true", text: `${v.icon} ` }),
              v.text,
            ),
            notes,
          ],
        };
      },
    },
    {
      key: "free",
      label: "Free",
      unit: "per GPU",
      numeric: true,
      help: "Memory left free on the most loaded GPU; “short”: how much is missing.",
      sort: (r) => r.layout?.free_bytes ?? null,
      cell: (r) => {
        if (!r.layout) return { value: "", content: dash("no valid layout") };
        const f = r.layout.free_bytes;
        return {
          value: f,
          className: f < 0 ? "short" : undefined,
          content: [`${formatBytes(f, lang)} ${f < 0 ? "short" : "free"}`],
        };
      },
    },
    {
      key: "needed",
      label: "Needed",
      unit: "per GPU",
      numeric: true,
      help: "The budget of the most loaded GPU, headroom included.",
      sort: (r) => r.layout?.total_bytes ?? null,
      cell: (r) =>
        r.layout
          ? { value: r.layout.total_bytes, content: [formatBytes(r.layout.total_bytes, lang)] }
          : { value: "", content: dash("no valid layout") },
    },
    {
      key: "limiting",
      label: "Limiting component",
      help: "The limiting component: the largest part of the most loaded GPU's budget (headroom excluded).",
      sort: (r) => (r.layout ? componentLabel(r.layout.limiting_component) : null),
      cell: (r) =>
        r.layout
          ? { value: r.layout.limiting_component, content: [componentLabel(r.layout.limiting_component)] }
          : { value: "", content: dash("no valid layout") },
    },
  ];
  for (const m of MAXIMA) {
    if (!rows.some((r) => r.layout?.maxima?.[m.key] !== undefined && r.layout.maxima[m.key] !== null))
      continue;
    cols.push({
      key: m.key,
      label: m.label,
      unit: m.unit,
      help: m.help,
      numeric: !m.text,
      sort: (r) => r.layout?.maxima?.[m.key] ?? null,
      cell: (r) => {
        const v = r.layout?.maxima?.[m.key];
        if (v === undefined || v === null) return { value: "", content: dash(m.text ? "none fits" : "not solved") };
        if (m.text) return { value: v, content: [v] };
        const content = [fixed(lang, v, m.digits ?? 0)];
        if (m.key === "context_tokens" && r.layout.maxima.context_limited_by_model)
          content.push(el("span", { className: "sub", text: "model max" }));
        return { value: v, content, title: v === 0 ? "not even 1 fits" : undefined };
      },
    });
  }
  return cols;
}

/** Every column key, in the table's order (the `columns` attribute picks among them). */
export const COLUMN_KEYS = Object.freeze([
  "gpu",
  "devices",
  "verdict",
  "free",
  "needed",
  "limiting",
  ...MAXIMA.map((m) => m.key),
]);

function compare(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true, sensitivity: "base" });
}

export class VrambudgetFits extends HTMLElement {
  static observedAttributes = ["service", "workload", "request", "device-counts", "gpus", "columns", "caption", "lang"];

  #root;
  #status;
  #error;
  #table;
  #caption;
  #title;
  #thead;
  #tbody;
  #notes;
  #abort = null;
  #scheduled = false;
  #request = null;
  #response = null;
  #rows = [];
  #columns = [];
  #sort = { key: null, direction: "ascending" };

  constructor() {
    super();
    this.#root = this.attachShadow({ mode: "open" });
    const style = el("style", { text: STYLE });
    this.#status = el("p", { className: "status", role: "status", "aria-live": "polite", part: "status" });
    this.#error = el("div", { className: "error", role: "alert", part: "error" });
    // The caption names the table for assistive technology; the same words show above the
    // scrolling table (a caption would scroll with a wide table, out of sight).
    this.#caption = el("caption", { id: "caption" });
    this.#title = el("p", { className: "title", part: "title", "aria-hidden": "true" });
    this.#thead = el("thead", { part: "head" });
    this.#tbody = el("tbody", { part: "body" });
    this.#table = el("table", { part: "table", hidden: true }, this.#caption, this.#thead, this.#tbody);
    const scroll = el(
      "div",
      { className: "scroll", part: "scroll", role: "region", "aria-labelledby": "caption", tabIndex: 0 },
      this.#table,
    );
    this.#notes = el("div", { className: "notes", part: "notes" });
    this.#root.append(style, this.#title, this.#status, this.#error, scroll, this.#notes);
    this.#thead.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-key]");
      if (button) this.sortBy(button.dataset.key);
    });
  }

  connectedCallback() {
    this.#schedule();
  }

  disconnectedCallback() {
    this.#abort?.abort();
  }

  attributeChangedCallback(name, before, after) {
    if (before === after || !this.isConnected) return;
    if (name === "caption" || name === "lang") {
      if (this.#response) this.#render();
    } else this.#schedule();
  }

  /** The FitRequest the element sends (built from its attributes). */
  get request() {
    return this.#buildRequest();
  }

  /** The last `/v1/fits` answer shown (null before the first, or after an error). */
  get response() {
    return this.#response;
  }

  /** Set the workload from a JS object (or an array: the first is fitted, the rest co-located). */
  set workload(value) {
    this.setAttribute("workload", JSON.stringify(value));
  }

  get workload() {
    const w = this.getAttribute("workload");
    return w === null ? null : JSON.parse(w);
  }

  /** The service's base URL: the `service` attribute, else where this module was loaded from. */
  get serviceURL() {
    const s = this.getAttribute("service");
    const base = s ? new URL(s, document.baseURI) : new URL("../", import.meta.url);
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    return base.href;
  }

  /** Ask the service again. Resolves when the table (or the error) is shown. */
  refresh() {
    return this.#load();
  }

  /** Sort by a column key (as the header buttons do): a new column ascending, the same again
   * reversed. */
  sortBy(key, direction) {
    if (!this.#columns.some((c) => c.key === key)) return;
    const same = this.#sort.key === key;
    this.#sort = {
      key,
      direction: direction ?? (same && this.#sort.direction === "ascending" ? "descending" : "ascending"),
    };
    this.#renderHeadState();
    this.#renderBody();
    const col = this.#columns.find((c) => c.key === key);
    this.#status.textContent = `${this.#summary()} Sorted by ${col.label}, ${this.#sort.direction}.`;
  }

  #schedule() {
    if (this.#scheduled) return;
    this.#scheduled = true;
    queueMicrotask(() => {
      this.#scheduled = false;
      if (this.isConnected) this.#load();
    });
  }

  #lang() {
    return this.closest("[lang]")?.lang || document.documentElement.lang || "en";
  }

  #buildRequest() {
    const full = this.getAttribute("request");
    if (full !== null) return parseJSON("request", full);
    const text = this.getAttribute("workload");
    if (text === null || text.trim() === "")
      throw new AttributeError("workload", "no workload: set the workload attribute to a workload as JSON");
    const w = parseJSON("workload", text);
    const request = { workloads: Array.isArray(w) ? w : [w] };
    const counts = this.getAttribute("device-counts");
    request.device_counts = counts ? listOfCounts(counts) : DEFAULT_DEVICE_COUNTS;
    const gpus = this.getAttribute("gpus");
    if (gpus && gpus.trim() !== "")
      request.devices = gpus
        .split(",")
        .map((s) => s.trim())
        .filter((s) => s !== "")
        .map((id) => ({ source: "catalog", id }));
    return request;
  }

  /** The `columns` attribute's keys (null: every column); an unknown key is an error. */
  #chosenColumns() {
    const text = this.getAttribute("columns");
    if (text === null || text.trim() === "") return null;
    const keys = text.split(",").map((s) => s.trim()).filter((s) => s !== "");
    const unknown = keys.filter((k) => !COLUMN_KEYS.includes(k));
    if (unknown.length)
      throw new AttributeError(
        "columns",
        `the columns attribute names ${unknown.map((k) => `'${k}'`).join(", ")}; allowed: ${COLUMN_KEYS.join(", ")}`,
      );
    return keys;
  }

  #captionText() {
    return this.getAttribute("caption") || describe(this.#request, this.#lang());
  }

  async #load() {
    this.#abort?.abort();
    const controller = new AbortController();
    this.#abort = controller;
    let request;
    try {
      request = this.#buildRequest();
      this.#chosenColumns();
    } catch (e) {
      this.#fail({ status: 0, attribute: e.attribute, message: e.message });
      return;
    }
    const url = new URL("v1/fits", this.serviceURL).href;
    this.#table.setAttribute("aria-busy", "true");
    this.#status.textContent = "Asking the service which GPUs fit…";
    const timer = setTimeout(() => controller.abort(new DOMException("timeout", "TimeoutError")), TIMEOUT_MS);
    let answer;
    let body;
    try {
      answer = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "application/json" },
        body: JSON.stringify(request),
        signal: controller.signal,
      });
      body = await answer.json().catch(() => null);
    } catch (e) {
      if (this.#abort !== controller) return; // superseded by a newer request
      const why =
        e?.name === "TimeoutError" || controller.signal.reason?.name === "TimeoutError"
          ? `no answer within ${TIMEOUT_MS / 1000} s`
          : `${e?.message ?? e}`;
      this.#fail({
        status: 0,
        message: `Could not reach the vrambudget service at ${url} (${why}). A page on another origin needs the service to allow that origin (CORS).`,
      });
      return;
    } finally {
      clearTimeout(timer);
    }
    if (this.#abort !== controller) return;
    if (!answer.ok || body === null || !Array.isArray(body.gpus)) {
      this.#fail({ status: answer.status, problem: body, message: body?.detail ?? answer.statusText });
      return;
    }
    this.#request = request;
    this.#response = body;
    this.#render();
    this.dispatchEvent(
      new CustomEvent("vrambudget-fits-load", { detail: { request, response: body }, bubbles: true, composed: true }),
    );
  }

  #fail(detail) {
    this.#response = null;
    this.#table.hidden = true;
    this.#table.removeAttribute("aria-busy");
    this.#notes.replaceChildren();
    this.#title.textContent = "";
    this.#status.textContent = "";
    const p = detail.problem;
    const lines = [];
    if (p && typeof p === "object") {
      const title = p.title ?? "Error";
      lines.push(el("p", {}, el("strong", { text: `The service refused this request: ${title} (${detail.status}).` })));
      const errors = Array.isArray(p.errors) ? p.errors : [];
      if (errors.length)
        lines.push(
          el(
            "ul",
            {},
            ...errors.map((e) =>
              el("li", { "data-field": e.field }, el("code", { text: e.field }), `: ${e.message}`),
            ),
          ),
        );
      else if (p.detail) lines.push(el("p", { text: p.detail }));
    } else if (detail.attribute) {
      lines.push(el("p", {}, el("strong", { text: "This table is not set up right: " }), detail.message));
    } else {
      const head = detail.status ? `The service answered ${detail.status}` : "The request failed";
      lines.push(el("p", {}, el("strong", { text: `${head}. ` }), detail.message ?? ""));
    }
    this.#error.replaceChildren(...lines);
    this.dispatchEvent(new CustomEvent("vrambudget-fits-error", { detail, bubbles: true, composed: true }));
  }

  #summary() {
    const rows = this.#rows;
    const count = (v) => rows.filter((r) => r.layout && verdictOf(r.layout) === v).length;
    const gpus = this.#response?.gpus?.length ?? 0;
    const layouts = rows.filter((r) => r.layout).length;
    return (
      `${gpus} GPU ${gpus === 1 ? "type" : "types"}, ${layouts} ${layouts === 1 ? "layout" : "layouts"}: ` +
      `${count("fits")} fit, ${count("fits_if_low")} only if low, ${count("does_not_fit")} do not fit.`
    );
  }

  #render() {
    const lang = this.#lang();
    this.#rows = rowsOf(this.#response);
    const keys = this.#columns.map((c) => c.key).join();
    const all = columns(this.#rows, lang);
    const chosen = this.#chosenColumns();
    this.#columns = chosen ? chosen.map((k) => all.find((c) => c.key === k)).filter(Boolean) : all;
    if (this.#columns.map((c) => c.key).join() !== keys || !this.#columns.some((c) => c.key === this.#sort.key))
      this.#sort = { key: null, direction: "ascending" };
    this.#error.replaceChildren();
    this.#caption.textContent = this.#title.textContent = this.#captionText();
    this.#thead.replaceChildren(
      el(
        "tr",
        {},
        ...this.#columns.map((c) =>
          el(
            "th",
            { scope: "col", className: c.numeric ? "num" : undefined, "data-key": c.key },
            el(
              "button",
              { type: "button", "data-key": c.key, title: c.help },
              el("span", {}, c.label, c.unit ? el("span", { className: "unit sub", text: c.unit }) : null),
              el("span", { className: "arrow", "aria-hidden": "true" }),
            ),
          ),
        ),
      ),
    );
    this.#renderHeadState();
    this.#renderBody();
    this.#renderNotes();
    this.#table.hidden = false;
    this.#table.removeAttribute("aria-busy");
    this.#status.textContent = this.#summary();
  }

  #renderHeadState() {
    for (const th of this.#thead.querySelectorAll("th")) {
      const sorted = th.dataset.key === this.#sort.key;
      if (sorted) th.setAttribute("aria-sort", this.#sort.direction);
      else th.removeAttribute("aria-sort");
      const arrow = th.querySelector(".arrow");
      arrow.textContent = sorted ? (this.#sort.direction === "ascending" ? "▲" : "▼") : "↕";
      arrow.classList.toggle("unsorted", !sorted);
    }
  }

  #renderBody() {
    const rows = [...this.#rows];
    const col = this.#columns.find((c) => c.key === this.#sort.key);
    if (col) {
      const sign = this.#sort.direction === "ascending" ? 1 : -1;
      rows.sort((a, b) => {
        const x = col.sort(a);
        const y = col.sort(b);
        if (x === null && y === null) return a.index - b.index;
        if (x === null) return 1; // rows without a value last, either way
        if (y === null) return -1;
        return sign * compare(x, y) || a.index - b.index;
      });
    }
    this.#tbody.replaceChildren(
      ...rows.map((r) =>
        el(
          "tr",
          {
            part: "row",
            "data-gpu-id": r.gpu.gpu_id ?? "",
            "data-device-count": r.layout?.device_count ?? "",
            "data-verdict": r.layout ? verdictOf(r.layout) : "",
          },
          ...this.#columns.map((c) => {
            const cell = c.cell(r);
            const cls = [c.numeric ? "num" : "", cell.className ?? ""].join(" ").trim();
            return el(
              c.header ? "th" : "td",
              {
                scope: c.header ? "row" : undefined,
                className: cls || undefined,
                "data-key": c.key,
                "data-value": String(cell.value),
                title: cell.title,
              },
              ...cell.content,
            );
          }),
        ),
      ),
    );
  }

  #renderNotes() {
    const items = [];
    for (const w of this.#response.warnings ?? []) items.push(el("li", { text: w }));
    for (const g of this.#response.gpus ?? [])
      for (const w of g.warnings ?? []) items.push(el("li", {}, el("strong", { text: `${g.name}: ` }), w));
    for (const x of this.#response.excluded ?? []) {
      const failing = (x.compatibility?.checks ?? []).filter((c) => c.verdict === "unsupported");
      items.push(
        el(
          "li",
          { "data-excluded": x.gpu_id ?? x.name },
          el("strong", { text: `${x.name}: not offered, the workload cannot run on it.` }),
          el(
            "ul",
            {},
            ...failing.map((c) =>
              el("li", { text: c.remedy ? `${sentence(c.reason)} Remedy: ${sentence(c.remedy)}` : sentence(c.reason) }),
            ),
          ),
        ),
      );
    }
    this.#notes.replaceChildren(...(items.length ? [el("ul", {}, ...items)] : []));
  }
}

if (!customElements.get("vrambudget-fits")) customElements.define("vrambudget-fits", VrambudgetFits);
