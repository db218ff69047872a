// The page /ui/fits: a workload described by its query (model, kind, batch, prompt, generate,
// seq, method, engine, context, dtype, counts, gpus, or the whole workload as JSON), a form to
// change it, and the <vrambudget-fits> table that shows its fits. docs/EMBED.md lists the
// parameters. Values are passed on as given: the service checks them and its 4xx names the field.
import "./vrambudget-fits.js";

const DEFAULTS = { model: "llama-3.1-8b", kind: "inference", counts: "1,2,4,8" };
const PARAMS = ["model", "kind", "batch", "prompt", "generate", "seq", "method", "engine", "context", "dtype", "counts", "gpus", "workload"];
// The page's dtype words for the serving engines' `dtype` (the others take them as they are).
const SERVING_DTYPES = { bf16: "bfloat16", fp16: "float16", fp32: "float32" };
// An error's field (problem+json `errors[].field`) -> the form input it came from.
const FIELD_INPUTS = [
  [/^\$\.workloads\[0\]\.model\b/, "model"],
  [/^\$\.workloads\[0\]\.kind\b/, "kind"],
  [/^\$\.workloads\[0\]\.(batch_size|micro_batch_size)\b/, "batch"],
  [/^\$\.workloads\[0\]\.prompt_tokens\b/, "prompt"],
  [/^\$\.workloads\[0\]\.generated_tokens\b/, "generate"],
  [/^\$\.workloads\[0\]\.sequence_length\b/, "seq"],
  [/^\$\.workloads\[0\]\.method\b/, "method"],
  [/^\$\.workloads\[0\]\.engine\b/, "engine"],
  [/^\$\.workloads\[0\]\.max_model_len\b/, "context"],
  [/^\$\.workloads\[0\]\.(precision|dtype)\b/, "dtype"],
  [/^\$\.device_counts\b/, "counts"],
  [/^\$\.devices\b/, "gpus"],
];

/** A query value: absent or blank -> undefined; a whole number -> a number; anything else as
 * typed (the service refuses it naming the field). */
function value(params, name) {
  const v = params.get(name);
  if (v === null || v.trim() === "") return undefined;
  return /^-?\d+$/.test(v.trim()) ? Number(v.trim()) : v.trim();
}

/** The workload the query describes (everything not given is the service's default). */
export function workloadFrom(params) {
  const kind = value(params, "kind") ?? DEFAULTS.kind;
  const modelText = String(value(params, "model") ?? DEFAULTS.model);
  const model = modelText.includes("/") ? { source: "hub", id: modelText } : { source: "preset", id: modelText };
  const w = { kind, model };
  const put = (field, v) => {
    if (v !== undefined) w[field] = v;
  };
  const dtype = value(params, "dtype");
  if (kind === "llm_serving") {
    put("engine", value(params, "engine"));
    put("max_model_len", value(params, "context"));
    if (dtype !== undefined) w.dtype = SERVING_DTYPES[dtype] ?? dtype;
    return w;
  }
  if (kind === "training") {
    put("micro_batch_size", value(params, "batch"));
    put("sequence_length", value(params, "seq"));
    const method = value(params, "method");
    if (method !== undefined) w.method = { kind: method };
  } else {
    put("batch_size", value(params, "batch"));
    put("prompt_tokens", value(params, "prompt"));
    put("generated_tokens", value(params, "generate"));
  }
  if (dtype !== undefined) w.precision = { weights: dtype };
  return w;
}

// The form's placeholders: the service's own defaults, read from its OpenAPI document.
const DEFAULT_OF = {
  inference: { batch: ["InferenceWorkload", "batch_size"], prompt: ["InferenceWorkload", "prompt_tokens"], generate: ["InferenceWorkload", "generated_tokens"] },
  training: { batch: ["TrainingWorkload", "micro_batch_size"], seq: ["TrainingWorkload", "sequence_length"] },
  llm_serving: { context: ["LLMServingWorkload", "max_model_len"] },
};
let schemas = null;

const $ = (id) => document.getElementById(id);
const form = $("workload-form");
const table = $("fits");

function escapeAttribute(text) {
  return text.replaceAll("&", "&amp;").replaceAll("'", "&#39;").replaceAll("<", "&lt;");
}

function showKind(kind) {
  for (const node of form.querySelectorAll("[data-kinds]")) {
    const shown = node.dataset.kinds.split(" ").includes(kind);
    node.hidden = !shown;
    if (node.tagName === "OPTION") node.disabled = !shown;
  }
  showDefaults(kind);
}

function showDefaults(kind) {
  for (const [name, [schema, field]] of Object.entries(DEFAULT_OF[kind] ?? {})) {
    const d = schemas?.[schema]?.properties?.[field]?.default;
    $(name).placeholder = d === undefined ? "" : d === null ? "model's max" : `${d} (default)`;
  }
}

// The fields a workload JSON replaces (the GPU counts and GPUs still apply).
const WORKLOAD_FIELDS = ["model", "kind", "batch", "prompt", "generate", "seq", "method", "engine", "context", "dtype"];

/** With a workload JSON, the fields it replaces are disabled (and left out of the query). */
function syncAdvanced() {
  const json = $("workload").value.trim() !== "";
  for (const name of WORKLOAD_FIELDS) $(name).disabled = json;
}

function clearInvalid() {
  for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
}

/** Show the query's workload: fill the form, set the table's attributes, write the snippet. */
function apply(params) {
  for (const name of PARAMS) {
    const input = $(name);
    if (input) input.value = params.get(name) ?? (name === "model" || name === "counts" ? DEFAULTS[name] : "");
  }
  const kind = $("kind").value || DEFAULTS.kind;
  if (!$("kind").value) $("kind").value = DEFAULTS.kind;
  showKind(kind);
  const json = params.get("workload");
  $("advanced").open = Boolean(json);
  syncAdvanced();
  const workload = json && json.trim() !== "" ? json : JSON.stringify(workloadFrom(params));
  clearInvalid();
  table.setAttribute("workload", workload);
  table.setAttribute("device-counts", params.get("counts") || DEFAULTS.counts);
  const gpus = params.get("gpus");
  if (gpus) table.setAttribute("gpus", gpus);
  else table.removeAttribute("gpus");

  const script = new URL("vrambudget-fits.js", import.meta.url).href;
  const lines = [
    `<script type="module" src="${script}"></script>`,
    `<vrambudget-fits`,
    `  workload='${escapeAttribute(workload)}'`,
    `  device-counts="${escapeAttribute(params.get("counts") || DEFAULTS.counts)}"` + (gpus ? "" : ">"),
  ];
  if (gpus) lines.push(`  gpus="${escapeAttribute(gpus)}">`);
  lines.push(`</vrambudget-fits>`);
  $("snippet").textContent = lines.join("\n");
}

/** The query of the form as filled: only the fields of the chosen kind, only those given. */
function queryOfForm() {
  const q = new URLSearchParams();
  const kind = $("kind").value;
  for (const name of PARAMS) {
    const input = $(name);
    if (input.disabled) continue;
    const label = input.closest("[data-kinds]");
    if (label && !label.dataset.kinds.split(" ").includes(kind)) continue;
    const v = input.value.trim();
    if (v !== "" && !(name === "counts" && v === DEFAULTS.counts)) q.set(name, v);
  }
  return q;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const q = queryOfForm();
  history.pushState(null, "", `${location.pathname}${q.size ? `?${q}` : ""}`);
  apply(q);
});
$("kind").addEventListener("change", () => showKind($("kind").value));
$("workload").addEventListener("input", syncAdvanced);
window.addEventListener("popstate", () => apply(new URLSearchParams(location.search)));

table.addEventListener("vrambudget-fits-load", clearInvalid);
table.addEventListener("vrambudget-fits-error", (event) => {
  clearInvalid();
  const fromJSON = Boolean(new URLSearchParams(location.search).get("workload"));
  for (const e of event.detail.problem?.errors ?? []) {
    const field = String(e.field ?? "");
    const match = FIELD_INPUTS.find(([re]) => re.test(field));
    const name = fromJSON && field.startsWith("$.workloads") ? "workload" : match?.[1];
    if (name) $(name).setAttribute("aria-invalid", "true");
  }
  if (event.detail.attribute === "workload") $("workload").setAttribute("aria-invalid", "true");
});

// Model ids for the model field's suggestions (a Hub repository id may be typed too).
fetch(new URL("../v1/models", import.meta.url))
  .then((r) => (r.ok ? r.json() : []))
  .then((models) => {
    $("models").replaceChildren(
      ...models.map((m) => {
        const option = document.createElement("option");
        option.value = m.id;
        option.label = m.display_name ?? m.id;
        return option;
      }),
    );
  })
  .catch(() => {});
fetch(new URL("../schema/openapi.json", import.meta.url))
  .then((r) => (r.ok ? r.json() : null))
  .then((doc) => {
    schemas = doc?.components?.schemas ?? null;
    showDefaults($("kind").value);
  })
  .catch(() => {});

apply(new URLSearchParams(location.search));
