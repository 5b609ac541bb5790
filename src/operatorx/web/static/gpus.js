/* GPUs page: one testlist's runs on different GPUs against a baseline run. Every number is the page
   data's (web/gpus.py); this only picks the baseline and the model, and draws. */
"use strict";
(() => {
  const { data, el, fmt, param, setParam, plot, ptext, link, Grid } = OX;
  const runs = data.runs;
  const sel = document.getElementById("f-baseline");
  const wanted = runs.findIndex(r => r.run.id === param("baseline"));
  sel.value = runs[wanted >= 0 ? wanted : 0].run.id;
  const models = [...new Set(data.cases.flatMap(c => c.models.length ? c.models : ["(no source)"]))].sort();
  const modelSel = document.getElementById("f-model");
  for (const m of models) modelSel.append(el("option", { value: m }, m));
  if (models.includes(param("model"))) modelSel.value = param("model");

  const speed = v => (v === null || v === undefined) ? "-" : v.toFixed(3) + "×";
  const runLink = (i) => el("a", { href: link("run", { run: runs[i].run.id }), class: "run-link" }, runs[i].run.id);
  const table = (id, cols, rows) => {
    const t = document.getElementById(id);
    t.tHead.replaceChildren(el("tr", {}, ...cols.map(c => el("th", { class: c.num ? "num" : "" }, c.title))));
    t.tBodies[0].replaceChildren(...rows.map(r => el("tr", { "data-run": r.runId === undefined ? null : r.runId },
      ...cols.map(c => { const v = c.cell(r); return el("td", { class: c.num ? "num" : "", "data-key": c.key }, v); }))));
  };

  const caseCols = [
    { key: "label", title: "case", cell: r => r.label },
    { key: "models", title: "model", cell: r => r.models.join(", ") },
    { key: "winner", title: "fastest", cell: r => r.winner === null ? "" : runs[r.winner].name },
    ...runs.map((run, i) => ({ key: "s" + i, title: run.name, num: true, sortValue: r => r["s" + i],
      cell: r => r.index[i] === null ? el("span", { class: "st-missing" }, "absent")
        : r.st[i] !== "ok" ? el("a", { class: "st-" + r.st[i], href: link("case", { run: run.run.id, index: r.index[i] }) }, r.st[i])
        : el("a", { href: link("case", { run: run.run.id, index: r.index[i] }), title: `${fmt(r.latency_us[i], 2)} µs` },
             `${fmt(r.latency_us[i], 2)} µs · ${speed(r["s" + i])}`) })),
  ];
  const grid = new Grid(document.getElementById("gpu-cases"), document.getElementById("pager"), caseCols, { pageSize: 100 });

  function apply() {
    const b = Math.max(0, runs.findIndex(r => r.run.id === sel.value));
    const view = data.baselines[b];
    const model = modelSel.value;
    table("gpu-runs", [
      { key: "name", title: "GPU · backend", cell: r => runs[r.i].name + (r.i === b ? " (baseline)" : "") },
      { key: "run", title: "run", cell: r => runLink(r.i) },
      { key: "started", title: "started", cell: r => runs[r.i].run.started_at },
      { key: "geomean", title: "speedup (geomean)", num: true, cell: r => speed(view.overall.geomean[r.i]) },
      { key: "compared", title: "cases compared", num: true, cell: r => String(view.overall.cases[r.i]) },
      { key: "faster", title: "faster", num: true, cell: r => String(view.faster[r.i]) },
      { key: "slower", title: "slower", num: true, cell: r => String(view.slower[r.i]) },
      { key: "equal", title: "equal", num: true, cell: r => String(view.equal[r.i]) },
      { key: "wins", title: `fastest (of ${data.contested} contested)`, num: true, cell: r => String(data.wins[r.i]) },
      ...["ok", "unsupported", "error", "missing"].map(s => ({ key: s, title: s, num: true,
        cell: r => String(data.coverage[r.i].counts[s]) + (s === "missing" && data.coverage[r.i].absent
          ? ` (${data.coverage[r.i].absent} absent)` : "") })),
    ], runs.map((_, i) => ({ i, runId: runs[i].run.id })));

    const shownModels = view.models.filter(m => !model || m.model === model);
    table("gpu-models", [{ key: "model", title: "model", cell: m => m.model },
      ...runs.map((run, i) => ({ key: "m" + i, title: run.name, num: true,
        cell: m => `${speed(m.geomean[i])} (${m.cases[i]})` }))], shownModels);
    const others = runs.map((_, i) => i).filter(i => i !== b);
    plot("plot-models", others.map(i => ({ type: "bar", name: ptext(runs[i].name), x: shownModels.map(m => ptext(m.model)),
      y: shownModels.map(m => m.geomean[i]), customdata: shownModels.map(m => m.cases[i]),
      hovertemplate: "%{x}<br>%{y:.3f}× over %{customdata} cases<extra>%{fullData.name}</extra>" })),
      { barmode: "group", title: { text: `Geometric-mean speedup against ${ptext(runs[b].name)}` },
        yaxis: { title: { text: "baseline latency / run latency" } },
        shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { color: "#888", dash: "dot" } }] },
      shownModels.reduce((s, m) => s + others.filter(i => m.geomean[i] !== null).length, 0));

    const rows = data.cases.map((c, k) => {
      const r = { label: c.label, models: c.models, winner: c.winner, index: c.index, latency_us: c.latency_us,
                  st: c.status };
      view.speedups[k].forEach((s, i) => { r["s" + i] = s; });
      return r;
    }).filter(c => !model || (c.models.length ? c.models : ["(no source)"]).includes(model));
    document.getElementById("count").textContent = `${rows.length} of ${data.cases.length} cases`;
    grid.setRows(rows);
  }
  sel.addEventListener("change", () => { setParam("baseline", sel.value === runs[0].run.id ? "" : sel.value); apply(); });
  modelSel.addEventListener("change", () => { setParam("model", modelSel.value); setParam("page", ""); apply(); });
  apply();
})();
