/* Case page: one row in full: samples, how it stopped, telemetry, kernels, host time, the check, the trace. */
"use strict";
(() => {
  const { data, el, fmt, param, plot, link, ptext } = OX;
  const run = data.run;

  const kv = (pairs) => el("dl", { class: "kv" }, ...pairs.filter(p => p[1] !== undefined && p[1] !== null && p[1] !== "")
    .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, typeof v === "number" ? fmt(v, 2) : typeof v === "object"
      ? JSON.stringify(v) : String(v))]));
  const section = (title, ...body) => el("section", { class: "case-section", "data-section": title },
    el("h2", {}, title), ...body);
  const pre = (v) => el("pre", { class: "json" }, typeof v === "string" ? v : JSON.stringify(v, null, 1));
  const table = (cols, rows) => el("table", { class: "rows" },
    el("thead", {}, el("tr", {}, ...cols.map(c => el("th", {}, c[0])))),
    el("tbody", {}, ...rows.map(r => el("tr", {}, ...cols.map(c => {
      const v = typeof c[1] === "function" ? c[1](r) : r[c[1]];
      return el("td", { class: typeof v === "number" ? "num" : "" }, typeof v === "number" ? fmt(v, 2)
        : (v && typeof v === "object") ? JSON.stringify(v) : (v === undefined || v === null ? "" : String(v)));
    })))));

  function show(c) {
    const m = c.metrics || {};
    const box = document.getElementById("case");
    document.title = `Case ${c.index} · ${run.id} · OperatorX`;
    document.querySelector("h1").textContent = `Case ${c.index}: ${c.label}`;
    const nav = el("p", { class: "links" },
      el("a", { href: link("case", { run: run.id, index: c.index - 1 }) }, "‹ previous case"), " · ",
      el("a", { href: link("case", { run: run.id, index: c.index + 1 }) }, "next case ›"), " · ",
      el("a", { href: link("run", { run: run.id }) }, "all rows"));
    box.replaceChildren(nav,
      el("p", { class: "status st-" + c.status, id: "case-status" }, c.status + (c.error_kind ? ` (${c.error_kind})` : "")),
      c.message ? el("pre", { class: "message", id: "case-message" }, c.message) : "",
      // the terminal table's notes, whole (report/table.py: row_notes)
      (c.notes || []).length ? el("ul", { class: "notes", id: "case-notes" },
        ...c.notes.filter(n => n !== c.message).map(n => el("li", {}, n))) : "",
      m.rank_local ? el("p", { class: "message", id: "case-rank-local" },
        `rank-local: rank ${m.rank_local.rank} of ${m.rank_local.world} (${m.rank_local.split}), ` +
        `not the whole case: ${m.rank_local.rule}`) : "",
      kv([["backend", (c.op || {}).backend], ["side", c.side], ["sources", ((c.op || {}).sources || []).join(", ")],
          ["scheme", m.scheme], ["latency µs", m.latency_us], ["method", m.method], ["clock", m.clock],
          ["L2 state", m.l2_state], ["L2 verified", m.l2_verified], ["median noise", m.noise],
          ["TFLOP/s", m.tflops], ["GB/s", m.gbps], ["% of peak", m.pct_peak], ["% of datasheet", m.pct_datasheet],
          ["measured peak", m.peak && (m.peak.measured_tflops || m.peak.measured_memory_gbps) ?
            `${m.peak.compute_class}: ${m.peak.measured_tflops ?? "-"} TFLOP/s, ${m.peak.measured_memory_gbps ?? "-"} GB/s` : null],
          ["peak", m.peak ? `${m.peak.compute_class}: ${m.peak.tflops} TFLOP/s, ${m.peak.memory_gbps} GB/s (${m.peak.source})` : null],
          ["FLOP", m.flops], ["min bytes", m.min_bytes]]),
      el("details", {}, el("summary", {}, "args"), pre((c.op || {}).args)),
      m.rank_local ? el("details", {}, el("summary", {}, "the shard's args (what ran)"), pre(m.rank_local.shard)) : "");

    const samples = m.samples_us || [];
    const ab = m.ab;
    const abSeries = ab ? abValues(ab) : null;
    if (abSeries) {
      // an A/B row: each side's paired values (device rounds, else host batches), A and B side by side
      const n = abSeries.a.length + abSeries.b.length;
      plot("plot-samples", ["a", "b"].map(side => ({ type: "scatter", mode: "markers", name: side.toUpperCase(),
        x: abSeries[side].map((_, i) => i + 1), y: abSeries[side] })),
        { title: { text: `${abSeries.what}: A and B (µs)` }, xaxis: { title: { text: abSeries.unit } },
          yaxis: { title: { text: "µs" } } }, n);
    } else if (samples.length) {
      const s = m.summary_us || {};
      plot("plot-samples", [{ type: "histogram", x: samples, nbinsx: Math.min(80, Math.max(10, samples.length / 5)),
                              name: "samples", marker: { color: "#4a7ab5" } }],
           { title: { text: `${samples.length} samples (µs)` }, xaxis: { title: { text: "µs per call" } },
             yaxis: { title: { text: "samples" } },
             shapes: s.median ? [{ type: "line", x0: s.median, x1: s.median, yref: "paper", y0: 0, y1: 1,
                                   line: { color: "#c33", dash: "dot" } }] : [] }, samples.length);
    } else {
      document.getElementById("plot-samples").replaceChildren(el("p", { class: "empty" }, "No samples: the case did not run."));
      document.getElementById("plot-samples").dataset.points = "0";
    }

    const out = [];
    if (ab) out.push(abSection(ab));
    if (m.stop_reason || m.summary_us) {
      out.push(section("How it stopped", kv([["stop reason", m.stop_reason],
        ["warmup", m.warmup ? `${m.warmup.calls} calls, ${fmt(m.warmup.seconds, 2)} s` : null]]),
        m.summary_us ? table([["n", "n"], ["median", "median"], ["mean", "mean"], ["min", "min"], ["p10", "p10"],
                              ["p90", "p90"], ["max", "max"], ["iqr", "iqr"], ["cv", "cv"]], [m.summary_us]) : "",
        m.timing ? el("details", {}, el("summary", {}, "timing settings and what the timer saw"), pre(m.timing)) : ""));
    }
    if (m.ranks) out.push(ranksSection(m.ranks, m.latency_us));
    const t = m.telemetry;
    if (t) {
      const reading = k => t[k] && typeof t[k] === "object" ? [k, t[k].min, t[k].p50, t[k].max] : null;
      const readings = ["sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c"].map(reading).filter(Boolean);
      out.push(section("Telemetry",
        kv([["available", t.available], ["capped", t.capped], ["capping reasons", (t.capping_reasons || []).join(", ")],
            ["energy mJ", t.energy_mj], ["energy over s", t.energy_s], ["readings", t.readings]]),
        readings.length ? table([["reading", 0], ["min", 1], ["p50", 2], ["max", 3]], readings) : "",
        (t.attempts || []).length ? table([["latency µs", "latency_us"], ["pause s", "pause_s"], ["capped", "capped"],
          ["reasons", r => (r.capping_reasons || []).join(", ")], ["SM MHz", "sm_clock_mhz"], ["power W", "power_w"],
          ["stop", "stop_reason"], ["samples", "samples"], ["kept", "kept"]], t.attempts) : ""));
    }
    const p = m.profile;
    const tl = c.kernel_timeline;
    if (p && p.kernels) {
      const classOf = {};
      for (const b of (tl ? tl.bars : [])) classOf[b.name] = tl.classes[b.kernel_class] || b.kernel_class;
      out.push(section("Kernel breakdown",
        tl ? el("p", { class: "help", id: "kernel-timeline-basis" }, `Timeline: ${tl.basis}.`) : "",
        tl ? el("div", { class: "plot", id: "plot-kernels" }) : "",
        kv([["calls traced", p.calls], ["span µs (median)", p.span_us_median],
          ["busy µs (median)", p.busy_us_median], ["host gaps included", p.host_gaps_included],
          ["worker's launch gap µs", (m.timing || {}).launch_gap_us]]),
        table([["kernel", "name"], ["class", r => classOf[r.name] || ""], ["per call", "count_per_call"], ["µs per call", "device_us_per_call"],
               ["µs median", "device_us_median"], ["grid", "grid"], ["block", "block"],
               ["regs/thread", "registers_per_thread"], ["smem B", "shared_memory_bytes"]], p.kernels)));
    }
    if (m.profile_error) out.push(section("Profile error", el("pre", { class: "message" }, m.profile_error)));
    const h = m.host;
    if (h) {
      const layers = Object.entries(h.layers || {}).map(([name, info]) => ({ name, ...info }));
      out.push(section("Host time and layers", kv([["host µs per call", h.host_us_per_call], ["iqr µs", h.iqr_us],
          ["device µs per call", h.device_us_per_call], ["host-bound", h.host_bound], ["why", h.host_bound_why],
          ["warnings", (h.warnings || []).join("; ")]]),
        layers.length ? table([["layer", "name"], ["host µs", "host_us_per_call"], ["iqr µs", "iqr_us"],
          ["output vs public", r => r.error || (r.output_vs_public || {}).result || r.same_as || ""]], layers) : ""));
    }
    if (m.check) out.push(section("Check", kv(Object.entries(m.check))));
    if (m.trace_path || m.counters) {
      out.push(section("Trace and counters",
        m.trace_path ? el("p", {}, "trace (Perfetto): ", el("a", { href: "file://" + encodeURI(m.trace_path), class: "trace" },
                                                               m.trace_path)) : "",
        m.counters ? pre(m.counters) : ""));
    }
    const attention = m.backend_meta ? attentionSection(m.backend_meta) : null;
    if (attention) out.push(attention);
    if (m.backend_meta) out.push(section("Backend", kv(Object.entries(m.backend_meta))));
    if (m.case_seconds) {
      // started_unix_s is a moment, not a duration: shown as UTC time
      const secs = Object.entries(m.case_seconds).map(([k, v]) =>
        k === "started_unix_s" && typeof v === "number" ? ["started (UTC)", new Date(v * 1000).toISOString()] : [k, v]);
      out.push(section("Wall seconds", kv(secs)));
    }
    if (c.other && Object.keys(c.other).length) out.push(section("Other metrics", pre(c.other)));
    document.getElementById("case-sections").replaceChildren(...out);
    if (tl && p && p.kernels) kernelTimeline(tl);
  }

  // an attention row: the module, the attention backend that ran, the cache it read, how the batch split
  // between decode and prefill paths, graph or eager, and each projection's kernel (backends' metadata)
  function attentionSection(b) {
    const cache = b.kv_cache || b.state;
    if (!b.attention_backend && !cache) return null;
    const ab = b.attention_backend || {};
    const req = b.requests || {};
    const proj = b.projections || {};
    const paths = ["decode", "long_extend", "prefill"].filter(k => typeof req[k] === "number")
      .map(k => `${k} ${req[k]}`).join(", ");
    const pages = cache && (cache.block_size ? `blocks of ${cache.block_size} tokens`
      : cache.page_tokens ? `pages of ${cache.page_tokens} tokens` : "");
    const pairs = [
      ["module", b.module || b.form],
      ["attention backend", ab.name ? `${ab.name} (${[ab.class, ab.impl].filter(Boolean).join(", ")})`
        : (b.calls || {}).attention],
      ["prefill backend", ab.prefill_backend],
      ["metadata builder", b.metadata_builder], ["metadata", b.metadata],
      ["cache", cache ? [cache.spec, cache.dtype, pages].filter(Boolean).join(", ") : undefined],
      ["cache shape", cache && cache.shape], ["cache bytes", cache && cache.bytes],
      ["requests", paths], ["builder split", req.builder_split],
      ["timed call", b.cuda_graph === true ? `CUDA-graph replay (${b.cudagraph_mode || "?"})`
        : b.cuda_graph === false ? "eager" : undefined],
      ["graph note", b.graph_note],
      ["projections", proj.scheme ? [proj.scheme, proj.quant_config].filter(Boolean).join(", ")
        : (b.calls || {}).projections],
    ];
    const layers = proj.layers ? table([["layer", "name"], ["quant method", "quant_method"], ["kernel", "kernel"]],
      Object.entries(proj.layers).map(([name, k]) => ({ name, ...k }))) : "";
    return section("Attention", kv(pairs), layers);
  }

  // classes as report/kernel_class.py names them; one colour each, `other` grey
  const CLASS_COLOURS = { gemm: "#4a7ab5", expert_gemm: "#2a9d8f", attention: "#264653", rope: "#b5838d",
    quantize: "#e9c46a", activation: "#f4a261",
    routing: "#9b5de5", reduce: "#e76f51", collective: "#d62828", memory: "#8d99ae", other: "#bbbbbb" };

  // one row per kernel, a bar from its start to its end (web/timeline.py says what start means)
  function kernelTimeline(tl) {
    const label = (b, i) => { const n = b.name.length > 48 ? b.name.slice(0, 45) + "…" : b.name;
                              return ptext(`${i + 1} · ${n}`); };
    const rows = tl.bars.map((b, i) => ({ ...b, y: label(b, i) }));
    const traces = Object.keys(tl.classes).filter(k => rows.some(b => b.kernel_class === k)).map(k => {
      const bs = rows.filter(b => b.kernel_class === k);
      return { type: "bar", orientation: "h", name: ptext(tl.classes[k]), y: bs.map(b => b.y),
        x: bs.map(b => b.duration_us), base: bs.map(b => b.start_us), marker: { color: CLASS_COLOURS[k] || "#bbbbbb" },
        hovertext: bs.map(b => ptext(b.name)), textposition: "none", customdata: bs.map(b => [b.start_us, b.start_us + b.duration_us, b.launches_per_call]),
        hovertemplate: "%{hovertext}<br>%{customdata[0]:.2f} – %{customdata[1]:.2f} µs (%{x:.2f} µs per call, "
          + "%{customdata[2]} launches)<extra>%{fullData.name}</extra>" };
    });
    const height = Math.max(220, 110 + 26 * rows.length);
    document.getElementById("plot-kernels").style.height = `${height}px`;
    const busy = tl.busy_us_median !== null ? ` · busy µs (median) ${fmt(tl.busy_us_median, 2)}` : "";
    plot("plot-kernels", traces, {
      title: { text: `Kernels of one call: ${fmt(tl.total_us, 2)} µs laid end to end${busy}` },
      barmode: "overlay", height, margin: { t: 70, r: 20, b: 50, l: 20 },
      legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom" },
      xaxis: { title: { text: "µs from the call's first kernel (launch order, no gaps)" }, rangemode: "tozero" },
      yaxis: { autorange: "reversed", automargin: true, type: "category", categoryorder: "array", categoryarray: rows.map(b => b.y) } },
      rows.length);
  }

  // a multi-rank row (metrics.ranks): how its ranks were timed, and one line per rank with its GPU's
  // telemetry in brief; busy and collective times are null where ranks.kernel_times says why
  function ranksSection(r, latency) {
    const p50 = (t, k) => (t && t[k] && typeof t[k] === "object" ? t[k].p50 : null);
    const lines = (r.per_rank || []).map(p => ({ ...p, sm: p50(p.telemetry, "sm_clock_mhz"),
      power: p50(p.telemetry, "power_w"), temp: p50(p.telemetry, "temperature_c"),
      reasons: ((p.telemetry || {}).capping_reasons || []).join(", ") }));
    const tele = lines.some(p => p.telemetry);
    const cols = [["rank", "rank"], ["GPU", "gpu"], ["worker", "worker"], ["latency µs (median)", "latency_us"],
      ["busy µs", "busy_us"], ["collective µs", "collective_us"], ["capped", "capped"],
      ...(tele ? [["SM MHz p50", "sm"], ["power W p50", "power"], ["temp °C p50", "temp"], ["capping reasons", "reasons"]] : [])];
    const tbl = table(cols, lines);
    tbl.id = "rank-lines";
    return section("Ranks",
      el("p", { class: "help" }, `latency µs is the median over iterations of the slowest rank's time; ` +
        `every iteration started behind a barrier on all ${r.world} ranks.`),
      kv([["world", r.world], ["split", r.split], ["slowest rank µs (median, latency µs)", latency],
          ["fastest rank µs (median)", r.latency_us_min], ["skew µs (median slowest − fastest)", r.skew_us],
          ["iterations", r.iterations], ["capped ranks", (r.capped_ranks || []).length ? r.capped_ranks.join(", ") : "none"],
          ["barrier", r.barrier], ["collectives", (r.collectives || []).join(", ")], ["kernel times", r.kernel_times]]),
      tbl);
  }

  // the values an A/B paired, per side: the device rounds' medians, else the host batches'
  function abValues(ab) {
    const dev = ab.device && ab.device.round_median_us, host = ab.host && ab.host.batch_us_per_call;
    if (dev && (dev.a || []).length) return { what: "device time per round", unit: "round", a: dev.a, b: dev.b || [] };
    if (host && (host.a || []).length) return { what: "host time per batch", unit: "batch", a: host.a, b: host.b || [] };
    return null;
  }

  function abSection(ab) {
    const clocks = ["host", "device"].filter(k => ab[k]).map(k => ({ clock: k, ...ab[k] }));
    const ci = d => (d.ci_low_us === null || d.ci_low_us === undefined) ? "" :
      `[${d.ci_low_us >= 0 ? "+" : ""}${d.ci_low_us.toFixed(2)}, ${d.ci_high_us >= 0 ? "+" : ""}${d.ci_high_us.toFixed(2)}]`;
    const sides = ab.sides || {};
    return section("A/B: both sides",
      el("p", { class: "help" }, data.ab_says + "; each side's number is the median of its paired values."),
      kv([["A", (sides.a || {}).spec], ["B", (sides.b || {}).spec], ["outputs", (ab.outputs || {}).result],
          ["outputs differ by", (ab.outputs || {}).rel_error], ["note", sides.note]]),
      clocks.length ? el("table", { class: "rows", id: "ab-clocks" },
        el("thead", {}, el("tr", {}, ...["clock", "A µs", "B µs", "paired median difference B−A µs", "interval",
                                          "pairs", "verdict", "why"].map(h => el("th", {}, h)))),
        el("tbody", {}, ...clocks.map(d => el("tr", {},
          el("td", {}, d.clock), el("td", { class: "num" }, fmt(d.a_us, 2)), el("td", { class: "num" }, fmt(d.b_us, 2)),
          el("td", { class: "num" }, (d.diff_us >= 0 ? "+" : "") + d.diff_us.toFixed(2)), el("td", { class: "num" }, ci(d)),
          el("td", { class: "num" }, String(d.pairs)),
          el("td", {}, el("span", { class: "verdict v-" + d.verdict }, d.verdict +
            (d.numbers_verdict ? ` (${d.numbers_verdict} by the numbers alone)` : ""))),
          el("td", { class: "msg" }, [d.verdict_why, ...(d.conditions || []).map(x => x.text)].filter(Boolean).join("; ")))))) : "",
      ["a", "b"].some(s => (sides[s] || {}).check) ? table([["side", "side"], ["checked", "checked"], ["ok", "ok"],
        ["rel error", "rel_error"], ["bound", "bound"], ["reference", "reference"]],
        ["a", "b"].filter(s => (sides[s] || {}).check).map(s => ({ side: s.toUpperCase(), ...sides[s].check }))) : "");
  }

  function missing(why) {
    document.getElementById("case").replaceChildren(el("p", { class: "error", id: "error" }, why));
    const ps = document.getElementById("plot-samples");
    ps.dataset.points = "0";
  }

  if (data.case) { show(data.case); return; }
  // Static site: the case named in ?case= comes from the run's data script that holds it.
  const want = parseInt(param("case", String((data.indexes || [0])[0])), 10);
  const pos = (data.indexes || []).indexOf(want);
  if (pos < 0) { missing(`run ${run.id} has no case ${param("case")}`); return; }
  window.oxCaseChunk = (cases) => {
    const c = cases.find(x => x.index === want);
    if (c) show(c); else missing(`case ${want} not in its data file`);
  };
  const s = document.createElement("script");
  s.src = data.chunks[Math.floor(pos / data.chunk_size)];
  s.onerror = () => missing("the case's data file did not load");
  document.body.append(s);
})();
