/* llmdiag report: draws the charts described in #chart-data with uPlot. No network, no eval, no innerHTML. */
(function () {
  "use strict";
  var source = document.getElementById("chart-data");
  if (!source || typeof uPlot === "undefined") { return; }
  var specs = JSON.parse(source.textContent);

  function fmt(v) {
    if (v == null) { return "unavailable"; }
    var a = Math.abs(v);
    if (a >= 1000) { return Math.round(v).toLocaleString("en-US"); }
    if (a >= 100) { return v.toFixed(0); }
    if (a >= 10) { return v.toFixed(1); }
    return Number(v.toPrecision(3)).toString();
  }

  function markerPlugin(x) {
    return {
      hooks: {
        draw: function (u) {
          var left = u.valToPos(x, "x", true);
          var ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#555";
          ctx.setLineDash([6, 4]);
          ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
          ctx.beginPath();
          ctx.moveTo(left, u.bbox.top);
          ctx.lineTo(left, u.bbox.top + u.bbox.height);
          ctx.stroke();
          ctx.restore();
        }
      }
    };
  }

  function options(spec, width) {
    var series = [{ label: spec.x_label, value: function (u, v) {
      if (v == null) { return "\u2013"; }
      return spec.kind === "buckets" ? (spec.x_labels[v] || "") : fmt(v);
    } }];
    spec.series.forEach(function (s) {
      var one = { label: s.label, stroke: s.color, width: 2, spanGaps: true,
                 value: function (u, v) { return v == null ? "\u2013" : fmt(v); } };
      if (spec.kind === "buckets") {
        one.fill = s.color + "99";
        one.paths = uPlot.paths.bars({ size: [s.bar_size || 0.8, 60], align: s.bar_align || 0 });  // side by side: size and align
        one.points = { show: false };
      } else {
        one.points = { show: true, size: 5 };
      }
      series.push(one);
    });
    var xAxis = { label: spec.x_label, stroke: "#333", grid: { stroke: "#eee" } };
    var xScale = { time: false };
    if (spec.kind === "buckets") {
      xAxis.values = function (u, splits) { return splits.map(function (i) { return spec.x_labels[i] || ""; }); };
      xAxis.incrs = [1, 2, 3, 4, 5, 10];
      xAxis.space = 60;
      xScale.range = function () { return [-0.5, spec.x.length - 0.5]; };
    } else if (spec.kind === "sweep") {
      xAxis.splits = function () { return spec.x; };  // ticks at the levels that were run
      if (spec.x_log) { xScale.distr = 3; xScale.log = 2; }
    }
    var yScale = { range: function (u, min, max) { return [0, spec.y_max != null ? spec.y_max : (max > 0 ? max * 1.1 : 1)]; } };
    return {
      width: width,
      height: 240,
      series: series,
      scales: { x: xScale, y: yScale },
      axes: [xAxis, { label: spec.y_label, stroke: "#333", grid: { stroke: "#eee" }, size: 60,
                      values: function (u, splits) { return splits.map(fmt); } }],
      legend: { show: true },
      cursor: { drag: { x: false, y: false } },
      plugins: spec.marker_x != null ? [markerPlugin(spec.marker_x)] : []
    };
  }

  specs.forEach(function (spec) {
    var target = document.getElementById("chart-" + spec.id);
    if (!target) { return; }
    var width = Math.max(320, Math.min(target.clientWidth || 560, 900));
    var data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
    new uPlot(options(spec, width), data, target);
    target.setAttribute("data-rendered", "1");
  });
  document.body.setAttribute("data-charts-rendered", String(specs.length));
})();
