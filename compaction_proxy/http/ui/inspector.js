// The inspector page: presentation over the admin API, nothing more. Every piece of
// conversation text is attacker-controlled, so text is only ever set with textContent (or
// created as text nodes), never parsed as markup.

import { timelineChart } from "/admin/ui/chart.js";

const TOKEN_KEY = "compaction-proxy-admin-token";
const PAGE = 25;
const LOG_PAGE = 200;
const state = { offset: 0, query: "", conversation: null, logEvents: [], logNext: null, selected: new Set() };

const $ = (id) => document.getElementById(id);

function element(tag, text = null, className = null) {
  const made = document.createElement(tag);
  if (text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

async function api(path, { method = "GET", body = null } = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) ?? ""}` };
  const upstreamKey = $("upstream-key").value.trim();
  if (method === "POST") {
    headers["Content-Type"] = "application/json";
    if (upstreamKey) headers["X-Upstream-Authorization"] = `Bearer ${upstreamKey}`;
  }
  const response = await fetch(path, { method, headers, body: body === null ? null : JSON.stringify(body) });
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = { reason: `the proxy answered ${response.status} without JSON` };
  }
  if (response.status === 401) {
    logOut("The admin token was refused.");
  }
  return { status: response.status, data };
}

function show(view) {
  for (const id of ["login-view", "list-view", "conversation-view"]) $(id).hidden = id !== view;
  $("logout").hidden = view === "login-view";
}

function logOut(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  $("login-error").textContent = message;
  show("login-view");
}

function when(seconds) {
  return typeof seconds === "number" ? new Date(seconds * 1000).toLocaleString() : "";
}

// -- conversations list ---------------------------------------------------------------------

async function loadList() {
  const query = new URLSearchParams({ limit: String(PAGE), offset: String(state.offset) });
  if (state.query) query.set("q", state.query);
  const { status, data } = await api(`/admin/conversations?${query}`);
  if (status === 404) {
    logOut("The admin API is off on this proxy.");
    return;
  }
  if (status !== 200) {
    $("list-error").textContent = data.reason ?? `error ${status}`;
    return;
  }
  $("list-error").textContent = data.conversations.length ? "" : "No conversation matches.";
  const body = $("conversations").querySelector("tbody");
  body.replaceChildren();
  for (const c of data.conversations) {
    const row = element("tr", null, "link");
    row.dataset.conversation = c.conversation;
    row.append(
      element("td", c.session ?? "—"),
      element("td", c.conversation),
      element("td", c.model ?? ""),
      element("td", (c.tenant ?? "").slice(0, 8)),
      element("td", when(c.last_seen)),
      element("td", c.generation),
      element("td", typeof c.last_pressure === "number" ? `${Math.round(c.last_pressure * 100)} %` : ""),
    );
    row.addEventListener("click", () => openConversation(c.conversation));
    body.append(row);
  }
  $("newer").disabled = state.offset === 0;
  $("older").disabled = data.next_offset === null;
  state.nextOffset = data.next_offset;
  show("list-view");
}

// -- one conversation -------------------------------------------------------------------------

async function openConversation(conversation) {
  state.conversation = conversation;
  state.selected.clear();
  $("action-result").textContent = "";
  show("conversation-view");
  await refreshConversation();
}

async function refreshConversation() {
  const base = `/admin/conversations/${encodeURIComponent(state.conversation)}`;
  const [facts, timeline, surface] = await Promise.all([
    api(base),
    api(`${base}/timeline`),
    api(`${base}/surface`),
  ]);
  renderFacts(facts);
  renderTimeline(timeline);
  renderSurface(surface);
  state.logEvents = [];
  state.logNext = null;
  await loadLog(false);
}

function renderFacts({ status, data }) {
  $("conversation-title").textContent = data.session ? `${data.session} (${state.conversation})` : state.conversation;
  const list = $("conversation-facts");
  list.replaceChildren();
  if (status !== 200) {
    list.append(element("dt", "error"), element("dd", data.reason ?? status));
    return;
  }
  const facts = [
    ["generation", data.generation],
    ["model", data.model ?? ""],
    ["tenant", (data.tenant ?? "").slice(0, 8)],
    ["last activity", when(data.last_seen)],
    ["pressure", typeof data.last_pressure === "number" ? `${Math.round(data.last_pressure * 100)} %` : ""],
    ["replacements", data.records.length],
    ["proactive compaction", data.proactive_compaction_stopped ? "stopped (the client keeps missing its checkpoints)" : "on"],
  ];
  for (const [name, value] of facts) {
    const dd = element("dd", value);
    if (name === "generation") dd.id = "generation";
    list.append(element("dt", name), dd);
  }
}

function renderTimeline({ status, data }) {
  const holder = $("chart");
  holder.replaceChildren();
  if (status !== 200) {
    holder.append(element("p", data.reason ?? `error ${status}`, "error"));
    return;
  }
  holder.append(timelineChart(data, (text) => { $("chart-hover").textContent = text; }));
}

function partsText(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return content === null || content === undefined ? "" : JSON.stringify(content);
  return content
    .map((part) => (part && part.type === "text" && typeof part.text === "string" ? part.text : `[${part?.type ?? "part"}]`))
    .join("\n");
}

function messageBody(message) {
  const fragment = document.createDocumentFragment();
  const text = partsText(message.content);
  if (text) fragment.append(element("pre", text));
  for (const call of message.tool_calls ?? []) {
    const fn = call?.function ?? {};
    fragment.append(element("div", `calls ${fn.name ?? "?"}(${fn.arguments ?? ""}) [${call?.id ?? ""}]`, "call"));
  }
  if (message.tool_call_id) fragment.append(element("div", `result of ${message.tool_call_id}`, "call"));
  return fragment;
}

function span(node) {
  return node.start === node.end ? `#${node.start}` : `#${node.start}–${node.end}`;
}

function renderSurface({ status, data }) {
  const list = $("surface");
  list.replaceChildren();
  if (status !== 200) {
    $("surface-total").textContent = data.reason ?? `error ${status}`;
    return;
  }
  const total = data.nodes.reduce((sum, n) => sum + n.tokens, 0);
  $("surface-total").textContent = `${data.nodes.length} messages, about ${total} tokens`;
  const partner = new Map();
  for (const [call, result] of data.tool_pairs) {
    partner.set(call, [...(partner.get(call) ?? []), result]);
    partner.set(result, [...(partner.get(result) ?? []), call]);
  }
  data.nodes.forEach((node, index) => {
    const message = data.messages[index];
    const item = element("li", null, `node ${node.kind}`);
    item.dataset.kind = node.kind;
    item.dataset.index = String(index);
    const meta = element("div", null, "meta");
    if (node.kind !== "head") {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.className = "select";
      box.title = "select for a region compaction";
      box.addEventListener("change", () => select(node, box.checked));
      meta.append(box);
    }
    meta.append(element("span", message.role, "role"));
    meta.append(element("span", node.kind === "head" ? "head" : span(node)));
    meta.append(element("span", `${node.tokens} tokens`));
    if (node.kind === "pruned" && node.masked) {
      meta.append(element("span", `masked: ${node.chars_before} characters cleared`, "masked"));
    } else if (node.kind === "pruned") {
      meta.append(element("span", `pruned: ${node.chars_before} → ${node.chars_after} characters`));
    }
    const pairs = partner.get(index);
    if (pairs) {
      const partners = pairs.map((p) => (p < index ? "the call" : "the result") + ` at ${span(data.nodes[p])}`);
      meta.append(element("span", `paired with ${partners.join(", ")}`));
      item.addEventListener("mouseenter", () => pairs.forEach((p) => list.children[p]?.classList.add("paired")));
      item.addEventListener("mouseleave", () => pairs.forEach((p) => list.children[p]?.classList.remove("paired")));
    }
    item.append(meta);
    if (node.kind === "checkpoint") {
      const details = element("details", null, "checkpoint-text");
      details.append(
        element("summary", `checkpoint over ${span(node)}: ${node.shadowed_tokens} tokens of history → ${node.tokens}`),
      );
      details.append(messageBody(message));
      item.append(details);
    } else {
      item.append(messageBody(message));
    }
    list.append(item);
  });
  updateSelection();
}

function select(node, chosen) {
  const key = `${node.start}:${node.end}`;
  if (chosen) state.selected.add(key);
  else state.selected.delete(key);
  updateSelection();
}

function selectedRegion() {
  const bounds = [...state.selected].map((key) => key.split(":").map(Number));
  if (!bounds.length) return null;
  return { start: Math.min(...bounds.map((b) => b[0])), end: Math.max(...bounds.map((b) => b[1])) };
}

function updateSelection() {
  const region = selectedRegion();
  $("compact-region").disabled = region === null;
  $("selection").textContent = region ? `positions ${region.start}–${region.end}` : "";
}

async function loadLog(more) {
  const query = new URLSearchParams({ limit: String(LOG_PAGE) });
  if (more && state.logNext) query.set("after", state.logNext);
  const { status, data } = await api(`/admin/conversations/${encodeURIComponent(state.conversation)}/log?${query}`);
  if (status !== 200) return;
  state.logEvents.push(...data.events);
  state.logNext = data.next;
  $("log-more").hidden = !data.next;
  const filter = $("log-filter");
  const types = new Set(state.logEvents.map((e) => e.type));
  const chosen = filter.value;
  filter.replaceChildren(element("option", "all"));
  filter.firstChild.value = "";
  for (const type of [...types].sort()) {
    const option = element("option", type);
    option.value = type;
    filter.append(option);
  }
  filter.value = types.has(chosen) ? chosen : "";
  renderLog();
}

function renderLog() {
  const wanted = $("log-filter").value;
  const body = $("log").querySelector("tbody");
  body.replaceChildren();
  for (const event of state.logEvents) {
    if (wanted && event.type !== wanted) continue;
    const { id, ts, type, ...rest } = event;
    const details = JSON.stringify(rest);
    const row = element("tr");
    row.dataset.type = type;
    row.append(element("td", when(ts)), element("td", type), element("td", details.length > 400 ? `${details.slice(0, 400)}…` : details));
    body.append(row);
  }
}

async function runAction(path, body, label) {
  $("action-result").textContent = `${label}: working…`;
  const { status, data } = await api(path, { method: "POST", body });
  if (status === 200) {
    $("action-result").textContent = `${label}: ${data.outcome}, generation ${data.generation}, ${data.tokens_shadowed} tokens replaced`;
    state.selected.clear();
    await refreshConversation();
  } else {
    const reason = data.reason ?? data.outcome ?? `error ${status}`;
    $("action-result").textContent = `${label} refused: ${reason}`;
  }
}

// -- wiring ---------------------------------------------------------------------------------

function wire() {
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    $("login-error").textContent = "";
    state.offset = 0;
    await loadList();
  });
  $("logout").addEventListener("click", () => logOut());
  $("search-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    state.query = $("search").value.trim();
    state.offset = 0;
    await loadList();
  });
  $("newer").addEventListener("click", async () => {
    state.offset = Math.max(0, state.offset - PAGE);
    await loadList();
  });
  $("older").addEventListener("click", async () => {
    if (state.nextOffset !== null) state.offset = state.nextOffset;
    await loadList();
  });
  $("back").addEventListener("click", loadList);
  $("log-filter").addEventListener("change", renderLog);
  $("log-more").addEventListener("click", () => loadLog(true));
  const base = () => `/admin/conversations/${encodeURIComponent(state.conversation)}`;
  $("compact-now").addEventListener("click", () => runAction(`${base()}/compact`, {}, "Compaction"));
  $("compact-region").addEventListener("click", () => {
    const region = selectedRegion();
    if (region) runAction(`${base()}/compact-region`, region, "Region compaction");
  });
  if (sessionStorage.getItem(TOKEN_KEY)) loadList();
  else show("login-view");
}

wire();
