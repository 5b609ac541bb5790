/* Run group page: the rows of every run of the group as one sweep, each with its shard; filtered by
   shard, status and text, sorted by any column. */
"use strict";
(() => {
  const { data, el, param, setParam, fillSelect, uniq, sortNatural, link, Grid, rankColumns } = OX;
  const rows = data.rows;
  const STATUSES = ["ok", "unsupported", "error", "missing"];
  const shardOf = r => r.shard || r.run;

  const columns = [
    { key: "index", title: "#", num: true, cell: r => String(r.index) },
    { key: "label", title: "case", cell: r => el("a", { href: link("case", { run: r.run, index: r.index }),
                                                        class: "case-link" }, r.label) },
    { key: "shard", title: "shard", sortValue: shardOf, cell: r => el("a", { href: link("run", { run: r.run }),
                                                                             class: "shard-link" }, shardOf(r)) },
    { key: "scheme", title: "scheme" },
    { key: "m", title: "M", num: true, cell: r => r.m === null ? "-" : String(r.m) },
    { key: "status", title: "status", cell: r => el("span", { class: "status" }, r.status) },
    ...data.metrics.map(m => ({ key: m.key, title: m.title, num: true, digits: m.digits })),   // shown.py
    ...rankColumns(rows),                  // world, skew µs: where some row ran over several ranks
    { key: "note", title: "note", sortable: false, cls: "msg",
      cell: r => (r.notes && r.notes.length ? r.notes : [r.error_kind, r.message].filter(Boolean)).join("; ") },
  ];
  const grid = new Grid(document.getElementById("rows-table"), document.getElementById("pager"), columns,
                        { pageSize: 100 });
  const q = document.getElementById("q");
  q.value = param("q");

  function apply() {
    const shard = param("shard"), status = param("status"), text = q.value.trim().toLowerCase();
    const shown = rows.filter(r => (!shard || shardOf(r) === shard) && (!status || r.status === status)
      && (!text || (r.label + " " + r.message).toLowerCase().includes(text)));
    document.getElementById("count").textContent = `${shown.length} of ${rows.length} rows`;
    grid.setRows(shown);
  }
  const reset = () => { setParam("page", ""); apply(); };
  fillSelect("f-shard", sortNatural(uniq(rows.map(shardOf))), "shard", reset);
  const statusSel = fillSelect("f-status", STATUSES, "status", reset);
  q.addEventListener("input", () => { setParam("q", q.value.trim()); reset(); });

  const counts = {};
  for (const r of rows) counts[r.status] = (counts[r.status] || 0) + 1;
  const bar = document.getElementById("status-counts");
  for (const s of STATUSES) {
    bar.append(el("button", { class: "count-chip st-" + s, "data-status": s, onclick: () => {
      statusSel.value = statusSel.value === s ? "" : s; setParam("status", statusSel.value); reset(); } },
      `${s} ${counts[s] || 0}`));
  }
  apply();
})();
