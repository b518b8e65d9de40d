// The timeline chart, drawn as SVG: one point per request (tokens forwarded), the tokens the
// client sent as a second line, the window and watermarks as horizontal lines, compactions as
// vertical marks by trigger and outcome, overflows as crosses. Only presentation: every number
// comes from GET /admin/conversations/{id}/timeline.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 1000;
const HEIGHT = 320;
const MARGIN = { top: 16, right: 110, bottom: 52, left: 64 };

function node(name, attributes = {}, text = null) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) {
    element.setAttribute(key, String(value));
  }
  if (text !== null) element.textContent = text;
  return element;
}

function describe(point) {
  const parts = [
    `request ${point.index + 1}`,
    `sent ${point.sent_tokens ?? "?"} tokens`,
    `forwarded ${point.forwarded_tokens ?? "?"}`,
    `status ${point.status}`,
    `generation ${point.generation ?? "?"}`,
  ];
  if (point.prompt_tokens !== null) parts.push(`upstream counted ${point.prompt_tokens}`);
  if (point.cache_read_tokens) parts.push(`${point.cache_read_tokens} read from its cache`);
  if (point.cache_written_tokens) parts.push(`${point.cache_written_tokens} written to it`);
  if (point.http_status !== null) parts.push(`HTTP ${point.http_status}`);
  return parts.join(" · ");
}

export function timelineChart(data, onHover) {
  const points = data.requests;
  const limits = [
    ["window", data.window],
    ["threshold", data.threshold],
    ["precompact", data.precompact],
  ].filter(([, value]) => typeof value === "number");
  const highest = Math.max(
    1,
    ...points.map((p) => Math.max(p.sent_tokens ?? 0, p.forwarded_tokens ?? 0)),
    ...limits.map(([, value]) => value),
  );
  const plotWidth = WIDTH - MARGIN.left - MARGIN.right;
  const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const x = (index) => MARGIN.left + (points.length > 1 ? (index / (points.length - 1)) * plotWidth : plotWidth / 2);
  const y = (tokens) => MARGIN.top + plotHeight - (tokens / highest) * plotHeight;

  const svg = node("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": `${points.length} requests`,
  });
  svg.append(
    node("line", { class: "axis", x1: MARGIN.left, y1: y(0), x2: MARGIN.left + plotWidth, y2: y(0) }),
    node("line", { class: "axis", x1: MARGIN.left, y1: MARGIN.top, x2: MARGIN.left, y2: y(0) }),
    node("text", { class: "axis-label", x: MARGIN.left - 6, y: y(highest) + 4, "text-anchor": "end" }, String(highest)),
    node("text", { class: "axis-label", x: MARGIN.left - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
    node("text", { class: "axis-label", x: MARGIN.left + plotWidth / 2, y: y(0) + 16, "text-anchor": "middle" }, "requests"),
  );

  for (const [name, value] of limits) {
    svg.append(
      node("line", { class: `limit limit-${name}`, x1: MARGIN.left, y1: y(value), x2: MARGIN.left + plotWidth, y2: y(value) }),
      node("text", { class: "limit-label", x: MARGIN.left + plotWidth + 6, y: y(value) + 4 }, `${name} ${value}`),
    );
  }

  const line = (key) => points
    .filter((p) => typeof p[key] === "number")
    .map((p) => `${x(p.index).toFixed(1)},${y(p[key]).toFixed(1)}`)
    .join(" ");
  svg.append(
    node("polyline", { class: "series-sent", points: line("sent_tokens") }),
    node("polyline", { class: "series-forwarded", points: line("forwarded_tokens") }),
  );

  for (const compaction of data.compactions) {
    // Drawn just before the request it happened before (or after the last one).
    const at = Math.min(compaction.before_request, points.length - 1);
    const position = compaction.before_request >= points.length ? x(at) + 4 : x(at) - 4;
    const failed = compaction.outcome !== "committed";
    const mark = node("g", {
      class: `compaction-marker${failed ? " failed" : ""}`,
      "data-trigger": compaction.trigger ?? "",
      "data-outcome": compaction.outcome ?? "",
    });
    mark.append(
      node("line", { class: `compaction${failed ? " failed" : ""}`, x1: position, y1: MARGIN.top, x2: position, y2: y(0) }),
      node("polygon", {
        class: `compaction-mark${failed ? " failed" : ""}`,
        points: `${position - 5},${MARGIN.top} ${position + 5},${MARGIN.top} ${position},${MARGIN.top + 8}`,
      }),
      node("text", { class: "compaction-label", x: position + 7, y: MARGIN.top + 9 }, compaction.trigger ?? ""),
      node("title", {}, `${compaction.trigger} ${compaction.mechanism}: ${compaction.outcome}`),
    );
    svg.append(mark);
  }

  for (const overflow of data.overflows) {
    const point = points[overflow.request];
    if (!point) continue;
    const cx = x(point.index);
    const cy = y(point.forwarded_tokens ?? 0);
    const mark = node("g", { class: "overflow-marker" });
    mark.append(
      node("line", { class: "overflow-mark", x1: cx - 6, y1: cy - 6, x2: cx + 6, y2: cy + 6 }),
      node("line", { class: "overflow-mark", x1: cx - 6, y1: cy + 6, x2: cx + 6, y2: cy - 6 }),
      node("title", {}, `context overflow${overflow.limit ? ` (limit ${overflow.limit})` : ""}${overflow.retried ? ", retried" : ""}`),
    );
    svg.append(mark);
  }

  for (const point of points) {
    const circle = node("circle", {
      class: `point${point.status === "recovered" ? " recovered" : ""}`,
      cx: x(point.index).toFixed(1),
      cy: y(point.forwarded_tokens ?? 0).toFixed(1),
      r: 3.5,
      "data-index": point.index,
    });
    const text = describe(point);
    circle.append(node("title", {}, text));
    circle.addEventListener("mouseenter", () => onHover(text));
    svg.append(circle);
  }

  const legend = node("g", { class: "legend", transform: `translate(${MARGIN.left}, ${HEIGHT - 16})` });
  legend.append(
    node("line", { class: "series-forwarded", x1: 0, y1: 6, x2: 18, y2: 6 }),
    node("text", { x: 22, y: 10 }, "forwarded"),
    node("line", { class: "series-sent", x1: 90, y1: 6, x2: 108, y2: 6 }),
    node("text", { x: 112, y: 10 }, "sent by the client"),
    node("polygon", { class: "compaction-mark", points: "232,2 242,2 237,10" }),
    node("text", { x: 246, y: 10 }, "compaction (red: not committed)"),
    node("line", { class: "overflow-mark", x1: 432, y1: 1, x2: 442, y2: 11 }),
    node("line", { class: "overflow-mark", x1: 432, y1: 11, x2: 442, y2: 1 }),
    node("text", { x: 446, y: 10 }, "overflow"),
    node("circle", { class: "legend-recovered", cx: 512, cy: 6, r: 4 }),
    node("text", { x: 520, y: 10 }, "recovered retry"),
  );
  svg.append(legend);
  return svg;
}
