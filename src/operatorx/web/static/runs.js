/* Runs page: every run, filtered and sorted in the browser; filters in the URL. */
"use strict";
(() => {
  const { data, el, fmt, param, setParam, fillSelect, uniq, sortNatural, link, hasCompare, Grid } = OX;
  const runs = data.runs;
  const checked = new Set();
  const cmpButton = document.getElementById("compare-selected");
  const count = (r, s) => r.counts ? r.counts[s] : null;

  const columns = [];
  if (cmpButton) {
    columns.push({ key: "pick", title: "", sortable: false, cell: r => el("input", {
      type: "checkbox", class: "pick", "data-run": r.id, checked: checked.has(r.id) ? "checked" : null,
      onchange: e => { if (e.target.checked) checked.add(r.id); else checked.delete(r.id);
                       cmpButton.disabled = checked.size !== 2; } }) });
  }
  columns.push(
    { key: "id", title: "run", cell: r => el("a", { href: link("run", { run: r.id }), class: "run-link" }, r.id) },
    { key: "started_at", title: "started" },
    { key: "state", title: "state" },
    { key: "testlist", title: "testlist" },
    { key: "backend", title: "backend" },
    { key: "gpu", title: "GPU", cell: r => r.gpu || r.device },
    { key: "driver", title: "driver", cell: r => r.driver || "" },
    { key: "run_group", title: "group", cell: r => !r.run_group ? "" : r.group_href
      ? el("a", { href: r.group_href, class: "group-link" }, r.run_group) : r.run_group },
    { key: "shard", title: "shard", sortValue: r => r.shard ? Number(r.shard.split("/")[0]) : -1,
      cell: r => r.shard || "" },
    { key: "rows", title: "rows", num: true },
    { key: "ok", title: "ok", num: true, sortValue: r => count(r, "ok"), cell: r => fmt(count(r, "ok")) },
    { key: "unsupported", title: "unsupported", num: true, sortValue: r => count(r, "unsupported"),
      cell: r => fmt(count(r, "unsupported")) },
    { key: "error", title: "error", num: true, sortValue: r => count(r, "error"), cell: r => fmt(count(r, "error")) },
    { key: "missing", title: "missing", num: true, sortValue: r => count(r, "missing"),
      cell: r => fmt(count(r, "missing")) },
    { key: "views", title: "views", sortable: false, cell: r => el("span", {},
      el("a", { href: link("roofline", { run: r.id }) }, "roofline"), " ",
      el("a", { href: link("shape", { runs: [r.id] }) }, "shape"), " ",
      r.previous && hasCompare(r.previous, r.id)         // the comparison offered for it, and why (web/pairs.py)
        ? el("a", { href: link("compare", { a: r.previous, b: r.id }), class: "cmp-prev",
                    title: r.compare_why || "" }, "vs " + r.previous) : null) },
  );
  const grid = new Grid(document.getElementById("runs-table"), document.getElementById("pager"), columns,
                        { pageSize: 100 });
  const filters = ["testlist", "backend", "gpu", "state", "group"];
  const value = (r, f) => f === "gpu" ? (r.gpu || r.device) : f === "group" ? (r.run_group || "") : r[f];
  const q = document.getElementById("q");
  q.value = param("q");

  function apply() {
    const text = q.value.trim().toLowerCase();
    const want = Object.fromEntries(filters.map(f => [f, param(f)]));
    const rows = runs.filter(r => filters.every(f => !want[f] || value(r, f) === want[f])
      && (!text || [r.id, r.gpu, r.device, r.backend, r.testlist, r.state, r.run_group].join(" ").toLowerCase()
        .includes(text)));
    document.getElementById("count").textContent = `${rows.length} of ${runs.length} runs`;
    grid.setRows(rows);
  }
  const reset = () => { setParam("page", ""); apply(); };
  for (const f of filters) fillSelect("f-" + f, sortNatural(uniq(runs.map(r => value(r, f)))), f, reset);
  q.addEventListener("input", () => { setParam("q", q.value.trim()); reset(); });
  if (cmpButton) {
    cmpButton.addEventListener("click", () => {
      const [b, a] = runs.filter(r => checked.has(r.id)).map(r => r.id);   // newest first: B is the newer
      location.href = link("compare", { a, b });
    });
  }
  apply();
})();
