/* Roofline page: achieved TFLOP/s against arithmetic intensity, with the device's ceilings. */
"use strict";
(() => {
  const { data, param, fillSelect, uniq, sortNatural, plot, ptext, link } = OX;
  const points = data.points;
  fillSelect("f-scheme", sortNatural(uniq(points.map(p => p.scheme))), "scheme", draw);

  function draw() {
    const scheme = param("scheme");
    const shown = points.filter(p => !scheme || p.scheme === scheme);
    const traces = [];
    for (const s of uniq(shown.map(p => p.scheme))) {
      const ps = shown.filter(p => p.scheme === s);
      traces.push({ type: "scatter", mode: "markers", name: ptext(s || "points"), x: ps.map(p => p.intensity),
        y: ps.map(p => p.tflops), customdata: ps.map(p => p.index), marker: { size: 8 },
        text: ps.map(p => ptext(`#${p.index} ${p.label} ${p.scheme}`) + "<br>" + ptext(`${p.latency_us.toFixed(2)} µs, ` +
                                `${p.gbps ? p.gbps.toFixed(0) : "-"} GB/s` + (p.pct_peak ? `, ${p.pct_peak.toFixed(1)}% of peak` : ""))),
        hovertemplate: "%{text}<br>%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s<extra></extra>" });
    }
    const bw = data.memory_gbps;
    const knees = Object.values(data.compute_tflops || {}).filter(tf => bw && tf).map(tf => tf * 1000 / bw);
    const xs = shown.map(p => p.intensity);
    const lo = Math.min(...xs, ...knees, 1) / 2, hi = Math.max(...xs, ...knees, 1000) * 2;
    // each ceiling says which of its two parts is this GPU's measured one: a class the calibration does
    // not measure (fp16, fp32) keeps its datasheet compute under a measured memory roof
    const computeMeasured = data.compute_measured || {};
    const label = cls => {
      const c = !!computeMeasured[cls], m = !!data.memory_measured;
      return c && m ? "ceiling (measured)" : c ? "ceiling (compute measured)" : m ? "ceiling (memory measured)" : "ceiling";
    };
    const ceiling = (cls, tf, gbps, what, dash) => {
      const knee = tf * 1000 / gbps;                       // FLOP/B where bandwidth meets compute
      traces.push({ type: "scatter", mode: "lines", name: ptext(`${cls} ${what} ${tf.toFixed(0)} TFLOP/s, ${gbps.toFixed(0)} GB/s`),
        x: [lo, knee, hi], y: [lo * gbps / 1000, tf, tf], line: { dash }, hoverinfo: "name" });
    };
    for (const [cls, tf] of Object.entries(data.compute_tflops || {})) {
      if (bw && tf) ceiling(cls, tf, bw, label(cls), "dash");
    }
    const dbw = data.datasheet_memory_gbps || bw;          // measured ceilings: the datasheet's beside, dotted
    for (const [cls, tf] of Object.entries(data.datasheet_tflops || {})) {
      if (dbw && tf) ceiling(cls, tf, dbw, "datasheet", "dot");
    }
    document.getElementById("count").textContent = `${shown.length} points`;
    plot("plot-roofline", traces, { xaxis: { title: { text: "arithmetic intensity (FLOP / byte)" }, type: "log" },
                                    yaxis: { title: { text: "TFLOP/s" }, type: "log" } }, shown.length);
    const div = document.getElementById("plot-roofline");
    if (div.on && !div.dataset.clicks) {
      div.dataset.clicks = "1";
      div.on("plotly_click", ev => {
        const p = ev.points && ev.points[0];
        if (p && p.customdata !== undefined) location.href = link("case", { run: data.run.id, index: p.customdata });
      });
    }
  }
  draw();
})();
