/* Run page: the run's rows, filtered by model, role, scheme, M, status and text; sorted by any number. */
"use strict";
(() => {
  const { data, el, fmt, param, setParam, fillSelect, uniq, sortNatural, link, Grid, rankColumns } = OX;
  const run = data.run;
  const rows = data.rows;

  // the terminal table's notes, whole (report/table.py: row_notes), and an A/B row's
  function note(r) {
    const parts = [];
    if (r.error_kind && r.status === "error") parts.push(r.error_kind);
    for (const n of r.notes || []) parts.push(n);
    if (!(r.notes || []).length && r.message) parts.push(r.message);
    return parts.join("; ");
  }
  // an ab run: both sides per clock, the paired median difference B−A with its interval, the verdict
  const abSide = (clock, side) => r => (r.ab && r.ab[clock] ? r.ab[clock][side + "_us"] : null);
  const abDiff = clock => r => {
    const d = r.ab && r.ab[clock];
    if (!d || d.diff_us === null || d.diff_us === undefined) return "-";
    const sign = v => (v >= 0 ? "+" : "") + v.toFixed(2);
    return sign(d.diff_us) + (d.ci_low_us !== null && d.ci_high_us !== null ? ` [${sign(d.ci_low_us)}, ${sign(d.ci_high_us)}]` : "");
  };
  const abVerdict = clock => r => {
    const d = r.ab && r.ab[clock];
    return d ? el("span", { class: "verdict v-" + d.verdict, title: d.verdict_why || "" },
                  d.verdict + (d.numbers_verdict ? ` (${d.numbers_verdict} by the numbers alone)` : "")) : "-";
  };
  const abClocks = ["host", "device"].filter(clock => rows.some(r => r.ab && r.ab[clock]));  // a CPU A/B has no device
  const abColumns = abClocks.flatMap(clock => [
    { key: `ab_${clock}_a`, title: `${clock} A µs`, num: true, digits: 2, sortValue: abSide(clock, "a"),
      cell: r => fmt(abSide(clock, "a")(r), 2) },
    { key: `ab_${clock}_b`, title: `${clock} B µs`, num: true, digits: 2, sortValue: abSide(clock, "b"),
      cell: r => fmt(abSide(clock, "b")(r), 2) },
    { key: `ab_${clock}_diff`, title: `${clock}: paired median difference B−A µs [CI]`, num: true,
      sortValue: r => (r.ab && r.ab[clock] ? r.ab[clock].diff_us : null), cell: abDiff(clock) },
    { key: `ab_${clock}_verdict`, title: `${clock} verdict`, sortValue: r => (r.ab && r.ab[clock] ? r.ab[clock].verdict : null),
      cell: abVerdict(clock) },
  ]);
  const isAb = rows.some(r => r.ab);

  const columns = [
    { key: "index", title: "#", num: true, cell: r => String(r.index) },
    { key: "label", title: "case", cell: r => el("a", { href: link("case", { run: run.id, index: r.index }),
                                                        class: "case-link" }, r.label) },
    { key: "scheme", title: "scheme" },
    { key: "m", title: "M", num: true, cell: r => r.m === null ? "-" : String(r.m) },
    { key: "status", title: "status", cell: r => el("span", { class: "status" }, r.status) },
    ...(isAb ? abColumns : []),
    ...(isAb ? [{ key: "ab_outputs", title: "outputs", sortValue: r => (r.ab ? r.ab.outputs : null),
                  cell: r => (r.ab && r.ab.outputs) || "" }] : []),
    ...(isAb ? [] : data.metrics.map(m => ({ key: m.key, title: m.title, num: true, digits: m.digits }))),   // shown.py
    ...rankColumns(rows),                  // world, skew µs: where some row ran over several ranks
    { key: "sources", title: "sources", sortable: false, cls: "src", cell: r => r.sources.join(", ") },
    { key: "note", title: "note", sortable: false, cls: "msg", cell: note },
  ];
  if (uniq(rows.map(r => r.backend)).length > 1 || uniq(rows.map(r => r.side)).length > 1) {
    columns.splice(4, 0, { key: "backend", title: "backend", cell: r => r.backend + (r.side ? ` (${r.side})` : "") });
  }
  const grid = new Grid(document.getElementById("rows-table"), document.getElementById("pager"), columns,
                        { pageSize: 100 });
  const q = document.getElementById("q");
  q.value = param("q");

  function apply() {
    const model = param("model"), role = param("role"), scheme = param("scheme"), m = param("m"),
      status = param("status"), text = q.value.trim().toLowerCase();
    const shown = rows.filter(r => (!model || r.models.includes(model)) && (!role || r.roles.includes(role))
      && (!scheme || r.scheme === scheme) && (!m || String(r.m) === m) && (!status || r.status === status)
      && (!text || (r.label + " " + r.message + " " + r.sources.join(" ")).toLowerCase().includes(text)));
    document.getElementById("count").textContent = `${shown.length} of ${rows.length} rows`;
    grid.setRows(shown);
  }
  const reset = () => { setParam("page", ""); apply(); };
  fillSelect("f-model", sortNatural(uniq(rows.flatMap(r => r.models))), "model", reset);
  fillSelect("f-role", sortNatural(uniq(rows.flatMap(r => r.roles))), "role", reset);
  fillSelect("f-scheme", sortNatural(uniq(rows.map(r => r.scheme))), "scheme", reset);
  fillSelect("f-m", sortNatural(uniq(rows.map(r => r.m))).map(String), "m", reset);
  const statusSel = fillSelect("f-status", ["ok", "unsupported", "error", "missing"], "status", reset);
  q.addEventListener("input", () => { setParam("q", q.value.trim()); reset(); });

  const counts = {};
  for (const r of rows) counts[r.status] = (counts[r.status] || 0) + 1;
  const bar = document.getElementById("status-counts");
  for (const s of ["ok", "unsupported", "error", "missing"]) {
    bar.append(el("button", { class: "count-chip st-" + s, "data-status": s, onclick: () => {
      statusSel.value = statusSel.value === s ? "" : s; setParam("status", statusSel.value); reset(); } },
      `${s} ${counts[s] || 0}`));
  }
  apply();
})();
