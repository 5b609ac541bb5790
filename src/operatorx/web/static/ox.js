/* OperatorX dashboard: helpers every page shares. Text reaches the page only through text nodes
   (never innerHTML), so a row's message shows as the characters it holds. */
"use strict";

const OX = (() => {
  const data = JSON.parse(document.getElementById("ox-data").textContent);
  const L = data.links;
  const params = new URLSearchParams(location.search);

  function ref(id) {
    return L.static ? ((L.slugs && L.slugs[id]) || id) : encodeURIComponent(id);
  }

  function link(kind, p) {
    if (kind === "compare" && L.static) {           // one file per ordered pair, named by the build
      return (L.compares || {})[String(p.a) + "\n" + String(p.b)] || "#";
    }
    let s = L.patterns[kind] || "";
    for (const [k, v] of Object.entries(p || {})) {
      const val = (k === "run" || k === "a" || k === "b") ? ref(String(v))
        : k === "runs" ? v.map(encodeURIComponent).join(",") : encodeURIComponent(String(v));
      s = s.split("{" + k + "}").join(val);
    }
    return s;
  }

  function hasCompare(a, b) {
    return !L.static || L.pairs.includes(a + "\n" + b);
  }

  function safeHref(h) {
    return /^\s*(javascript|data|vbscript):/i.test(h) ? "#" : h;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "href") e.setAttribute("href", safeHref(String(v)));
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "-";
    const d = digits === undefined ? 1 : digits;
    const a = Math.abs(v);
    if (Number.isInteger(v) || a >= 100) return Math.round(v).toLocaleString("en-US");
    if (a >= 1) return v.toFixed(d);
    if (v === 0) return "0";
    return Number(v.toPrecision(3)).toString();
  }

  function param(name, fallback) {
    const v = params.get(name);
    return v === null ? (fallback === undefined ? "" : fallback) : v;
  }

  /* Filters live in the URL so a view can be shared; replaceState keeps Back for real navigation. */
  function setParam(name, value) {
    if (value === "" || value === null || value === undefined) params.delete(name);
    else params.set(name, String(value));
    const q = params.toString();
    const url = location.pathname + (q ? "?" + q : "") + location.hash;
    try { history.replaceState(null, "", url); } catch (e) { /* some file:// pages refuse it */ }
  }

  function fillSelect(id, values, name, onChange, labelOf) {
    const sel = document.getElementById(id);
    if (!sel) return null;
    for (const v of values) sel.append(el("option", { value: v }, labelOf ? labelOf(v) : v));
    const want = param(name);
    if (want !== "" && [...sel.options].some(o => o.value === want)) sel.value = want;
    sel.addEventListener("change", () => { setParam(name, sel.value); onChange(); });
    return sel;
  }

  function uniq(values) {
    return [...new Set(values.filter(v => v !== null && v !== undefined && v !== ""))];
  }

  function sortNatural(values) {
    return values.sort((x, y) => (typeof x === "number" && typeof y === "number") ? x - y
      : String(x).localeCompare(String(y), "en", { numeric: true }));
  }

  /* A table rendered from data: sortable headers (sort=key or -key in the URL), one page at a time. */
  class Grid {
    constructor(table, pager, columns, opts) {
      this.table = table;
      this.pager = pager;
      this.columns = columns;
      this.pageSize = (opts && opts.pageSize) || 100;
      this.sortParam = (opts && opts.sortParam) || "sort";
      this.rows = [];
      this.onChange = (opts && opts.onChange) || (() => {});
    }

    sortKey() { return param(this.sortParam); }

    setRows(rows) {
      const key = this.sortKey();
      const desc = key.startsWith("-");
      const col = this.columns.find(c => c.key === (desc ? key.slice(1) : key));
      this.rows = rows;
      if (col) {
        const val = col.sortValue || (r => r[col.key]);
        const withV = rows.map(r => [val(r), r]);
        withV.sort((x, y) => {
          const a = x[0], b = y[0];
          const an = a === null || a === undefined, bn = b === null || b === undefined;
          if (an || bn) return an === bn ? 0 : an ? 1 : -1;            // empty cells last either way
          const c = (typeof a === "number" && typeof b === "number") ? a - b : String(a).localeCompare(String(b));
          return desc ? -c : c;
        });
        this.rows = withV.map(x => x[1]);
      }
      this.render();
    }

    pageCount() { return Math.max(1, Math.ceil(this.rows.length / this.pageSize)); }

    render() {
      const key = this.sortKey();
      const head = el("tr");
      for (const c of this.columns) {
        const mark = key === c.key ? " ▲" : key === "-" + c.key ? " ▼" : "";
        const th = el("th", { class: (c.num ? "num" : "") + (c.sortable === false ? "" : " sortable"),
                              "data-key": c.key }, c.title + mark);
        if (c.sortable !== false) {
          th.addEventListener("click", () => {
            const next = key === "-" + c.key ? c.key : key === c.key ? "" : (c.num ? "-" + c.key : c.key);
            setParam(this.sortParam, next);
            this.setRows(this.rows);
            this.onChange();
          });
        }
        head.append(th);
      }
      this.table.tHead.replaceChildren(head);
      let page = Math.min(Math.max(1, parseInt(param("page", "1"), 10) || 1), this.pageCount());
      const start = (page - 1) * this.pageSize;
      const body = document.createDocumentFragment();
      for (const r of this.rows.slice(start, start + this.pageSize)) {
        const tr = el("tr", { class: r.status ? "st-" + r.status : null });
        for (const c of this.columns) {
          const v = c.cell ? c.cell(r) : r[c.key];
          tr.append(el("td", { class: (c.num ? "num" : "") + (c.cls ? " " + c.cls : "") },
                       (typeof v === "number") ? fmt(v, c.digits) : (v === null || v === undefined) ? (c.num ? "-" : "") : v));
        }
        body.append(tr);
      }
      this.table.tBodies[0].replaceChildren(body);
      this.renderPager(page);
    }

    renderPager(page) {
      if (!this.pager) return;
      const n = this.pageCount();
      const go = p => () => { setParam("page", p === 1 ? "" : p); this.render(); };
      this.pager.replaceChildren(
        el("button", { class: "prev", disabled: page <= 1 ? "disabled" : null, onclick: go(page - 1) }, "‹ prev"),
        el("span", { class: "pageno" }, ` page ${page} of ${n} (${this.rows.length} rows) `),
        el("button", { class: "next", disabled: page >= n ? "disabled" : null, onclick: go(page + 1) }, "next ›"));
    }
  }

  /* A multi-rank row's columns (web/views.py: world, skew_us), where some row ran over several
     ranks; blank on a single-rank row, which has no skew. */
  function rankColumns(rows) {
    const has = v => v !== null && v !== undefined;
    if (!rows.some(r => has(r.world))) return [];
    return [
      { key: "world", title: "world", num: true,
        cell: r => (has(r.world) ? el("span", { title: r.split || "" }, String(r.world)) : "") },
      { key: "skew_us", title: "skew µs", num: true, cell: r => (has(r.skew_us) ? fmt(r.skew_us, 2) : "") },
    ];
  }

  /* Plotly reads a few HTML-like tags in its strings; entities make any text show as itself. */
  function ptext(s) {
    return String(s === null || s === undefined ? "" : s)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function plot(id, traces, layout, points) {
    const div = document.getElementById(id);
    if (!div) return;
    div.dataset.points = String(points);
    if (typeof Plotly === "undefined") {
      div.replaceChildren(el("p", { class: "error" }, "plotly.js did not load: no plot."));
      return;
    }
    const base = { margin: { t: 40, r: 20, b: 50, l: 70 }, hovermode: "closest", font: { size: 12 },
                   legend: { orientation: "h", y: -0.2 } };
    Plotly.react(div, traces, Object.assign(base, layout), { displaylogo: false, responsive: true });
    div.dataset.drawn = "1";
  }

  return { data, el, fmt, param, setParam, fillSelect, uniq, sortNatural, link, ref, hasCompare, Grid, plot, ptext,
           rankColumns };
})();
