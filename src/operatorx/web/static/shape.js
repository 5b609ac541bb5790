/* Shape page: latency and TFLOP/s against M for one shape family or one (model, role), a line per run. */
"use strict";
(() => {
  const { data, el, param, setParam, fillSelect, uniq, sortNatural, plot, ptext, link } = OX;
  const series = data.series;
  const all = series.flatMap(s => s.rows);
  const by = document.getElementById("f-by");
  by.value = param("by", "family") === "role" ? "role" : "family";

  // The family with the most rows is the default view.
  const sizes = {};
  for (const r of all) sizes[r.family] = (sizes[r.family] || 0) + 1;
  const families = Object.keys(sizes).sort((a, b) => sizes[b] - sizes[a] || a.localeCompare(b));
  const models = sortNatural(uniq(all.flatMap(r => r.models)));
  const hidden = new Set(param("hide").split(",").filter(Boolean));

  const famSel = fillSelect("f-family", families, "family", draw, f => `${f} (${sizes[f]})`);
  const modelSel = fillSelect("f-model", models, "model", () => { fillRoles(); draw(); });
  const roleSel = document.getElementById("f-role");
  roleSel.addEventListener("change", () => { setParam("role", roleSel.value); draw(); });

  function fillRoles() {
    const model = modelSel.value;
    const roles = sortNatural(uniq(all.filter(r => r.models.includes(model)).flatMap(r => r.roles)));
    roleSel.replaceChildren(...roles.map(v => el("option", { value: v }, v)));
    const want = param("role");
    if (roles.includes(want)) roleSel.value = want;
  }
  fillRoles();

  const pick = document.getElementById("runs-pick");
  series.forEach((s, i) => {
    const id = s.run.id;
    pick.append(el("label", { class: "run-pick" }, el("input", { type: "checkbox", "data-run": id,
      checked: hidden.has(String(i)) ? null : "checked", onchange: e => {
        if (e.target.checked) hidden.delete(String(i)); else hidden.add(String(i));
        setParam("hide", [...hidden].join(",")); draw(); } }), " ", s.name, " ",
      el("a", { href: link("run", { run: id }) }, "(run)")));
  });

  function draw() {
    const mode = by.value;
    document.getElementById("l-family").hidden = mode !== "family";
    document.getElementById("l-model").hidden = mode !== "role";
    document.getElementById("l-role").hidden = mode !== "role";
    const match = mode === "family" ? (r => r.family === famSel.value)
      : (r => r.models.includes(modelSel.value) && r.roles.includes(roleSel.value));
    const lat = [], tf = [];
    let points = 0;
    series.forEach((s, i) => {
      if (hidden.has(String(i))) return;
      // one line per (run, family): a model role can hold several schemes
      const groups = {};
      for (const r of s.rows.filter(match)) (groups[r.family + " " + r.side] = groups[r.family + " " + r.side] || []).push(r);
      for (const [g, rs] of Object.entries(groups)) {
        rs.sort((a, b) => a.m - b.m);
        const name = ptext(Object.keys(groups).length > 1 ? `${s.name} ${g}` : s.name);
        const text = rs.map(r => ptext(`${r.label} ${r.scheme} #${r.index}`));
        const common = { mode: "lines+markers", name, text, x: rs.map(r => r.m),
                         hovertemplate: "%{text}<br>M=%{x}<br>%{y}<extra>%{fullData.name}</extra>" };
        lat.push({ ...common, y: rs.map(r => r.latency_us) });
        tf.push({ ...common, y: rs.map(r => r.tflops) });
        points += rs.length;
      }
    });
    const title = mode === "family" ? famSel.value : `${modelSel.value} / ${roleSel.value}`;
    document.getElementById("count").textContent = `${points} points`;
    plot("plot-latency", lat, { title: { text: ptext(`latency µs: ${title}`) }, xaxis: { title: { text: "M" }, type: "log" },
                                yaxis: { title: { text: "latency µs" }, type: "log" } }, points);
    plot("plot-tflops", tf, { title: { text: ptext(`TFLOP/s: ${title}`) }, xaxis: { title: { text: "M" }, type: "log" },
                              yaxis: { title: { text: "TFLOP/s" } } }, points);
  }
  by.addEventListener("change", () => { setParam("by", by.value === "family" ? "" : "role"); draw(); });
  draw();
})();
