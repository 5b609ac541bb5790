/* Model page: a serving scenario's steps per run, layer boxes and a stacked bar per step. Every number
   is the page data's (web/model.py, from report/estimate.py's estimate); this only lays it out. */
"use strict";
(() => {
  const { data, el, fmt, plot, ptext } = OX;

  const add = document.getElementById("add-run");
  if (add) {
    add.addEventListener("click", () => {
      const sets = document.querySelectorAll("#model-form fieldset.model-run");
      if (sets.length >= Number(add.dataset.max)) return;
      const copy = sets[sets.length - 1].cloneNode(true);
      copy.dataset.slot = String(sets.length);
      copy.querySelector("legend").textContent = `run ${sets.length + 1}`;
      sets[sets.length - 1].after(copy);
    });
  }
  if (!data.runs.length) return;

  const us = v => `${fmt(v, 2)} µs`;
  const pct = v => `${(100 * v).toFixed(1)}%`;

  function stepLine(s) {
    const rate = s.tokens && s.tokens.tokens_per_s_per_gpu !== null
      ? ` · ${fmt(s.tokens.tokens_per_s_per_gpu, 1)} tokens/s per GPU` : "";
    const missing = s.unmeasured.length ? ` · ${s.unmeasured.length} ops not measured (not in the time)` : "";
    return el("p", { class: "step-total", "data-step": s.step, "data-time-us": s.time_us },
      el("b", {}, `${s.step} step: ${us(s.time_us)}`), ` · ${s.coverage}${rate}${missing}`);
  }

  function cell(c) {
    if (c === null) return el("td", { class: "absent" }, "—");
    const parts = [];
    if (c.time_us !== null) parts.push(el("span", { class: "time" }, `${us(c.time_us)} (${pct(c.share)})`));
    for (const why of c.not_measured) parts.push(el("div", { class: "st-unsupported not-measured" }, why));
    if (c.inside) parts.push(el("span", { class: "inside" }, `inside ${c.inside} (its case timed)`));
    return el("td", { class: "num", "data-time-us": c.time_us === null ? null : c.time_us }, ...parts);
  }

  function box(b, steps) {
    const title = b.kind + (b.layers ? ` · ${b.layers} layers` : b.kind === "LM head" ? " · once per step" : "");
    const head = el("tr", {}, el("th", {}, "part (roles)"), ...steps.map(s => el("th", { class: "num" }, s)));
    const rows = b.lines.map(line => el("tr", { "data-part": line.name }, el("td", {}, line.name),
      ...line.cells.map(cell)));
    const total = el("tr", { class: "box-total" }, el("th", {}, "box"),
      ...b.time_us.map(t => el("th", { class: "num", "data-time-us": t }, us(t))));
    return el("div", { class: "layer-box", "data-kind": b.kind }, el("h3", {}, title),
      el("table", { class: "rows" }, el("thead", {}, head), el("tbody", {}, ...rows, total)),
      ...b.notes.map(n => el("p", { class: "help" }, n)));
  }

  data.runs.forEach((r, i) => {
    const side = document.getElementById(`model-run-${i}`);
    if (!side || !r.estimate) return;
    const steps = r.estimate.steps.map(s => s.step);
    side.querySelector(".model-steps").replaceChildren(...r.estimate.steps.map(stepLine));
    side.querySelector(".layer-boxes").replaceChildren(...r.boxes.map(b => box(b, steps)));
  });

  // one bar per (step, run), stacked by op class; every run on one axis, a step's runs side by side
  const bars = [];
  for (const step of data.steps) {
    data.runs.forEach(r => {
      const s = r.estimate && r.estimate.steps.find(x => x.step === step);
      if (s) bars.push({ label: `${step} · ${r.name}`, step: s });
    });
  }
  let points = 0;
  const traces = data.classes.map(cls => {
    const y = bars.map(b => { const c = b.step.by_class.find(x => x.name === cls); return c ? c.time_us : null; });
    points += y.filter(v => v !== null).length;
    return { type: "bar", name: ptext(cls), x: bars.map(b => ptext(b.label)), y,
             customdata: bars.map(b => { const c = b.step.by_class.find(x => x.name === cls); return c ? pct(c.share) : ""; }),
             hovertemplate: "%{x}<br>%{y:.2f} µs (%{customdata})<extra>%{fullData.name}</extra>" };
  });
  plot("plot-steps", traces, { barmode: "stack", title: { text: "Σ count × latency per step (measured ops only)" },
    yaxis: { title: { text: "µs per step" } } }, points);
})();
