/* Compare page: per case B/A latency ratio with its interval and verdict, and the ratio against M. */
"use strict";
(() => {
  const { data, el, fmt, param, setParam, fillSelect, uniq, sortNatural, plot, ptext, link, Grid } = OX;
  const cases = data.cases;
  const ratioCell = r => r.ratio === null ? "-"
    : `${r.ratio.toFixed(3)}` + (r.ci_low !== null && r.ci_high !== null ? ` [${r.ci_low.toFixed(3)}, ${r.ci_high.toFixed(3)}]` : "");
  const columns = [
    { key: "label", title: "case", cell: r => r.index_b !== null
      ? el("a", { href: link("case", { run: data.b.id, index: r.index_b }) }, r.label) : r.label },
    { key: "family", title: "family" },
    { key: "m", title: "M", num: true, cell: r => r.m === null ? "-" : String(r.m) },
    { key: "a_latency_us", title: "A µs", num: true, digits: 2 },
    { key: "b_latency_us", title: "B µs", num: true, digits: 2 },
    { key: "ratio", title: "B/A [CI]", num: true, cell: ratioCell },
    { key: "q_value", title: "q", num: true, cell: r => r.q_value === null ? "-" : r.q_value.toPrecision(2) },
    { key: "verdict", title: "verdict", cell: r => el("span", { class: "verdict v-" + r.verdict,
      title: r.verdict_why || "" }, r.verdict + (r.numbers_verdict ? ` (${r.numbers_verdict} by the numbers alone)` : "")) },
    // every flag whole, one a line: why the verdict was held back first
    { key: "flags", title: "flags", sortable: false, cls: "msg flags", cell: r => el("div", {},
      ...(r.verdict_why ? [el("div", { class: "why" }, r.verdict_why)] : []),
      ...r.flags.map(f => el("div", { class: "flag" }, f))) },
  ];
  const grid = new Grid(document.getElementById("compare-table"), document.getElementById("pager"), columns,
                        { pageSize: 100 });

  const counts = {};
  for (const c of cases) counts[c.verdict] = (counts[c.verdict] || 0) + 1;
  document.getElementById("verdict-counts").replaceChildren(...Object.entries(counts).map(
    ([v, n]) => el("span", { class: "count-chip verdict v-" + v }, `${v} ${n}`)));

  function apply() {
    const verdict = param("verdict"), family = param("family");
    const shown = cases.filter(c => (!verdict || c.verdict === verdict) && (!family || c.family === family));
    document.getElementById("count").textContent = `${shown.length} of ${cases.length} cases`;
    grid.setRows(shown);
    const withRatio = shown.filter(c => c.ratio !== null && c.m !== null);
    const traces = [];
    for (const v of uniq(withRatio.map(c => c.verdict))) {
      const cs = withRatio.filter(c => c.verdict === v);
      traces.push({ type: "scatter", mode: "markers", name: ptext(v), x: cs.map(c => c.m), y: cs.map(c => c.ratio),
        text: cs.map(c => ptext(`${c.label} ${c.family}`)),
        error_y: { type: "data", symmetric: false, array: cs.map(c => c.ci_high === null ? 0 : c.ci_high - c.ratio),
                   arrayminus: cs.map(c => c.ci_low === null ? 0 : c.ratio - c.ci_low), thickness: 1 },
        hovertemplate: "%{text}<br>M=%{x}<br>B/A=%{y:.3f}<extra>%{fullData.name}</extra>" });
    }
    plot("plot-ratio", traces, { xaxis: { title: { text: "M" }, type: "log" }, yaxis: { title: { text: "B/A latency" }, type: "log" },
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { color: "#888", dash: "dot" } }] },
      withRatio.length);
  }
  const reset = () => { setParam("page", ""); apply(); };
  fillSelect("f-verdict", sortNatural(uniq(cases.map(c => c.verdict))), "verdict", reset);
  fillSelect("f-family", sortNatural(uniq(cases.map(c => c.family))), "family", reset);
  apply();
})();
