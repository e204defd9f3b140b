// The watch page: reads a shared run through the edge by SSE and writes controls into it.
//
// Rules this file owns:
// * The transcript is the stream, in stream order, each message once. A message counts when an
//   event names the offset after it: the edge's data events carry `id:` (the browser resumes
//   from there on its own reconnects, so their messages count at once); otherwise at the
//   control event's `streamNextOffset`. Anything not yet counted when a connection drops is
//   dropped with it and read again from the offset.
// * EventSource retries network errors itself (sending Last-Event-ID), but gives up for good on
//   a non-200 answer. Then the page shows the edge's answer and reopens a new EventSource
//   itself, with backoff, carrying its offset in the URL (a new EventSource sends no
//   Last-Event-ID).
// * Writes are idempotent producer appends (Producer-Id = this page, epoch 0, seq per accepted
//   append), one at a time, retried with the same seq until the origin answers, so a retried
//   click never appends twice.
// * Who holds the session and whether it was stopped is `fold(messages)`, the same fold as
//   devstack/session.py.
// * Anyone with write access can append any JSON value: a value that is not an object (null, a
//   number, a string, an array) is kept in the transcript, shown raw and skipped by the fold;
//   no message stops the ones after it from being shown.
// * The transcript is shown as a chat (see "showing"): grouping and wording change how messages
//   look, never which ones are shown or in what order.
"use strict";
(() => {
  const cfg = JSON.parse(document.getElementById("config").textContent);
  const streamUrl = cfg.edge + cfg.path;
  const me = "page-" + Array.from(crypto.getRandomValues(new Uint8Array(4)))
    .map((b) => b.toString(16).padStart(2, "0")).join("");
  const $ = (id) => document.getElementById(id);

  // Everything the page knows, for people (the DOM) and for tests (window.watch).
  const w = (window.watch = {
    me, messages: [], offset: "-1", bytes: 0, state: "connecting", ended: false,
    connections: 0, reopens: 0, errors: [], sent: [], viewers: null, states: ["connecting"],
    stopClickedAt: null, stopAckSeenAt: null,
  });

  // --- the session's shared state -------------------------------------------------------
  const isMessage = (m) => typeof m === "object" && m !== null && !Array.isArray(m);
  function name(m) { return `${m.from}:${m.seq}`; }
  function fold(messages) {
    let holder = null, heldBy = null, releasedBy = null, stoppedBy = null;
    const finished = new Set();
    for (const m of messages) {
      if (!isMessage(m)) continue;
      if (m.type === "control") {
        if (m.action === "stop" && stoppedBy === null) stoppedBy = name(m);
        else if (m.action === "take_over" && stoppedBy === null) { holder = m.from; heldBy = name(m); }
        else if (m.action === "release" && holder !== null && m.from === holder) {
          holder = null; releasedBy = name(m);
        }
      } else if (m.type === "status" && ["done", "stopped", "signed_off"].includes(m.state)) {
        finished.add(m.from);
      }
    }
    return { holder, heldBy, releasedBy, stoppedBy, finished };
  }

  // --- reading ------------------------------------------------------------------------------
  let source = null, pending = [], failures = 0;
  // With `make demo ARGS='--auth jwt'` the page carries a token of its own: in the URL for
  // EventSource (which cannot set headers), as a bearer header for its writes.
  const tokenParam = cfg.token ? `&token=${encodeURIComponent(cfg.token)}` : "";
  const sseUrl = () =>
    `${streamUrl}?offset=${encodeURIComponent(w.offset)}&live=sse${tokenParam}`;

  function connect() {
    w.connections++;
    pending = [];
    const es = (source = new EventSource(sseUrl()));
    es.onopen = () => { failures = 0; setConn("live"); showError(null); };
    es.addEventListener("data", (e) => {
      if (source !== es) return;
      pending.push(e.data);
      if (e.lastEventId && e.lastEventId !== w.offset) commit(e.lastEventId, false);
    });
    es.addEventListener("control", (e) => {
      if (source !== es) return;
      const control = JSON.parse(e.data);
      commit(control.streamNextOffset, Boolean(control.streamClosed));
    });
    es.onerror = () => {
      if (source !== es || w.ended) return;
      pending = [];
      if (es.readyState === EventSource.CLOSED) {
        es.close();
        source = null;
        setConn("error");
        reopenLater();
      } else {
        setConn("reconnecting");
      }
    };
  }

  let timer = null;
  function reopenLater() {
    const delay = Math.min(8000, 500 * 2 ** failures) * (0.75 + Math.random() * 0.5);
    failures++;
    timer = setTimeout(probe, delay);
  }

  // A device that knows it lost the network (the lift) drops its connection at once instead of
  // waiting for a dead socket to time out, and resumes from its offset as soon as it is back.
  window.addEventListener("offline", () => {
    if (w.ended || source === null) return;
    source.close();
    source = null;
    pending = [];
    setConn("reconnecting");
    showError("offline: waiting for the network");
    reopenLater();
  });
  window.addEventListener("online", () => {
    if (w.ended || source !== null) return;
    clearTimeout(timer);
    failures = 0;
    probe();
  });

  // EventSource hides the answer that made it give up: ask the same question once to show it,
  // and reopen only when the edge answers 200.
  let probing = false;
  async function probe() {
    timer = null;
    if (w.ended || source !== null || probing) return;
    probing = true;
    const abort = new AbortController();
    try {
      const response = await fetch(sseUrl(), { signal: abort.signal, cache: "no-store" });
      if (response.ok) {
        abort.abort();
        w.reopens++;
        connect();
        return;
      }
      const text = (await response.text()).slice(0, 200);
      showError(`edge answered HTTP ${response.status}: ${text.trim()} (retrying)`);
    } catch (error) {
      showError(`network error: ${error.message} (retrying)`);
    } finally {
      probing = false;
    }
    if (source !== null) return;
    setConn("reconnecting");
    reopenLater();
  }

  // A data event is a JSON array of messages; anything else is kept whole, as one raw message.
  function parse(data) {
    try {
      const value = JSON.parse(data);
      return Array.isArray(value) ? value : [value];
    } catch (error) {
      return [data];
    }
  }

  const encoder = new TextEncoder();
  function commit(offset, closed) {
    const fresh = [];
    for (const data of pending) {
      fresh.push(...parse(data));
      w.bytes += encoder.encode(data).length;
    }
    pending = [];
    w.offset = offset;
    for (const m of fresh) { w.messages.push(m); show(m); }
    if (closed) {
      w.ended = true;
      if (source) source.close();
      source = null;
      setConn("ended");
    }
    update();
  }

  // --- showing ------------------------------------------------------------------------------
  // The transcript reads like a chat: consecutive messages from one author (tokens, tool calls
  // and their results, reviews, a person's messages) are one bubble that grows as they stream,
  // tokens running on as one text; status and control messages are a line of plain words
  // between bubbles ("Alex took over", "the worker resumed"). Each message is shown once, in
  // stream order, in the bubble or line it arrived in.
  const transcript = $("transcript");
  let turn = null; // the bubble still growing: { from, parts, text }
  const cls = (value) => String(value).replace(/[^A-Za-z0-9_-]/g, "_");

  // Names everyone's page agrees on: a page's producer id becomes a first name picked by a hash
  // of it (a second id with the same name gets a suffix, in order of first appearance in the
  // stream, so every page that read the same prefix shows the same names); agents keep theirs.
  const NAMES = ["Alex", "Sam", "Robin", "Kim", "Jo", "Charlie", "Max", "Noa", "Eli", "Ari",
    "Lou", "Dani", "Mika", "Ren", "Sky", "Jules", "Nico", "Tess", "Ida", "Omar", "Lena", "Ravi",
    "Yuki", "Zoe", "Finn", "Maya", "Theo", "Ines", "Hugo", "Lia", "Otto", "Vera"];
  const names = new Map(), taken = new Set();
  const isPage = (id) => /^page-[0-9a-f]+$/.test(id);
  function hashed(id) {
    let h = 2166136261;
    for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
    return NAMES[(h >>> 0) % NAMES.length];
  }
  function nameOf(id, register = true) {
    id = String(id);
    if (names.has(id)) return names.get(id);
    let shown = isPage(id) ? hashed(id) : id.charAt(0).toUpperCase() + id.slice(1);
    if (taken.has(shown)) shown = `${shown} ${id.slice(-4)}`;
    if (register) { names.set(id, shown); taken.add(shown); }
    return shown;
  }
  w.nameOf = (id) => nameOf(id, false); // what the demo's summary calls a writer, for tests
  // In a sentence: "you" for this page, "the worker" for one of the run's agents, else a name.
  const AGENTS = new Set(["user", "worker", "reviewer"]);
  function who(id) {
    const name = nameOf(id);
    if (id === me) return "you";
    return AGENTS.has(String(id)) ? `the ${String(id)}` : name;
  }
  const authorOf = (ref) =>
    typeof ref === "string" && ref.includes(":") ? ref.slice(0, ref.lastIndexOf(":")) : null;
  const upper = (text) => text.charAt(0).toUpperCase() + text.slice(1);

  function sentence(m) {
    const by = who(m.from);
    const asked = authorOf(m.ref);
    if (m.type === "control") {
      switch (m.action) {
        case "take_over": return `${by} took over`;
        case "release": return `${by} handed the run back`;
        case "stop": return `${by} pressed Stop`;
        default: return `${by} sent “${String(m.action)}”`;
      }
    }
    switch (m.state) {
      case "started": return `${by} started`;
      case "yielded": return asked ? `${by} paused for ${who(asked)}` : `${by} paused`;
      case "resumed": return `${by} resumed`;
      case "stopped": return asked ? `${by} was stopped by ${who(asked)}` : `${by} stopped`;
      case "done": return `${by} finished`;
      case "signed_off": return `${by} signed off`;
      default: return `${by}: ${String(m.state)}`;
    }
  }

  // Every message is shown: one that cannot be rendered is shown raw, so none breaks the page
  // or hides what follows it.
  function show(m) {
    // Follow the run while the reader is at the bottom; leave them be when they scrolled up.
    const follow = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 80;
    try {
      if (isMessage(m)) render(m);
      else raw(m);
    } catch (error) {
      w.errors.push(`could not show a message: ${error.message}`);
      raw(m);
    }
    if (follow) transcript.scrollTop = transcript.scrollHeight;
  }

  function block(classes, label, title) {
    const el = document.createElement("div");
    el.className = `msg ${classes}`;
    const head = document.createElement("span");
    head.className = "who";
    head.textContent = label;
    if (title) head.title = title;
    const body = document.createElement("div");
    body.className = "body";
    el.append(head, body);
    transcript.append(el);
    return { el, body };
  }

  function raw(m) {
    turn = null;
    let text;
    try { text = JSON.stringify(m); } catch (error) { text = undefined; }
    block("raw", "not a message").body.textContent = typeof text === "string" ? text : String(m);
  }

  function part(type, text) {
    const el = document.createElement("div");
    el.className = `part type-${cls(type)}`;
    el.textContent = text;
    turn.body.append(el);
    turn.text = null;
    return el;
  }

  function render(m) {
    if (m.type === "status" || m.type === "control") {
      turn = null;
      const line = block(`event type-${cls(m.type)} from-${cls(m.from)}`, "", m.from);
      if (m.type === "status") line.el.classList.add(`state-${cls(m.state)}`);
      line.body.textContent = upper(sentence(m));
      line.el.title = `${m.from}:${m.seq}${m.ref ? ` (after ${m.ref})` : ""}`;
      return;
    }
    if (turn === null || turn.from !== m.from) {
      const mine = m.from === me;
      const name = nameOf(m.from);
      const label = mine ? "You" : name;
      const kind = isPage(String(m.from)) ? "person" : "agent";
      turn = { from: m.from, ...block(`turn ${kind} from-${cls(m.from)}${mine ? " mine" : ""}`,
        label, String(m.from)), text: null };
    }
    switch (m.type) {
      case "token":
        if (turn.text === null) turn.text = part("token", "");
        turn.text.textContent += typeof m.text === "string" ? m.text : JSON.stringify(m.text);
        return;
      case "tool_call":
        part("tool_call", `calls ${m.name}(${JSON.stringify(m.args)})`);
        return;
      case "tool_result":
        part("tool_result",
          `→ ${typeof m.result === "string" ? m.result : JSON.stringify(m.result)}`);
        return;
      default:
        part(m.type, typeof m.text === "string" ? m.text : JSON.stringify(m));
    }
  }

  function setConn(state) {
    if (state !== w.state) w.states.push(state);
    w.state = state;
    $("conn").dataset.state = state;
    $("conn").textContent = state;
  }

  function showError(text) {
    $("error").hidden = text === null;
    $("error").textContent = text || "";
    if (text !== null) w.errors.push(text);
  }

  function size(bytes) {
    if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(1)} MB`;
    if (bytes >= 1e3) return `${(bytes / 1e3).toFixed(1)} KB`;
    return `${bytes} B`;
  }

  function update() {
    const state = fold(w.messages);
    const count = w.messages.length;
    $("position").textContent =
      `${count.toLocaleString("en")} message${count === 1 ? "" : "s"} · ${size(w.bytes)} received`;
    $("position").title = `offset ${w.offset}`;
    $("position").dataset.offset = w.offset;
    $("me").textContent = nameOf(me, false);
    $("holder-line").hidden = state.holder === null;
    $("holder").textContent = state.holder === me ? "you" : nameOf(state.holder || "", false);
    $("holder").title = state.holder || "";
    const mine = state.holder === me;
    const over = w.ended || state.stoppedBy !== null;
    // A control being sent disables its button: a double click is one control.
    const sending = (action) => w.sent.some((r) => r.fields.action === action && !r.done);
    $("stop").disabled = over || sending("stop");
    $("take").hidden = mine;
    $("take").disabled = over || sending("take_over");
    $("release").disabled = sending("release");
    $("release").hidden = !mine || over;
    $("say-form").hidden = !mine || over;
    if (state.stoppedBy !== null && w.stopAckSeenAt === null && w.stopClickedAt !== null &&
        w.messages.some((m) => isMessage(m) && m.type === "status" && m.state === "stopped")) {
      w.stopAckSeenAt = Date.now();
    }
  }

  // --- writing ------------------------------------------------------------------------------
  let nextSeq = 0, queue = Promise.resolve();
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function send(type, fields) {
    const record = { type, fields, seq: null, attempts: 0, status: null, done: false };
    w.sent.push(record);
    update();
    queue = queue.then(() => post(record)).then((ok) => {
      record.done = true;
      update();
      return ok;
    });
    return queue;
  }

  async function post(record) {
    const seq = nextSeq;
    record.seq = seq;
    const body = JSON.stringify({ type: record.type, from: me, seq, ...record.fields });
    const headers = {
      "Content-Type": "application/json",
      "Producer-Id": me, "Producer-Epoch": "0", "Producer-Seq": String(seq),
    };
    if (cfg.token) headers.Authorization = `Bearer ${cfg.token}`;
    for (let attempt = 0; !w.ended || attempt === 0; attempt++) {
      record.attempts++;
      try {
        const response = await fetch(streamUrl, { method: "POST", body, headers });
        record.status = response.status;
        if (response.ok) { nextSeq = seq + 1; return true; }
        if (response.status === 409 && response.headers.get("Stream-Closed")) {
          showError("the run has ended");
          return false;
        }
        if (response.status < 500) {
          showError(`write refused: HTTP ${response.status} ${(await response.text()).trim()}`);
          return false;
        }
      } catch (error) {
        record.status = "network error";
      }
      await sleep(Math.min(4000, 250 * 2 ** attempt));
    }
    return false;
  }

  $("stop").onclick = () => { w.stopClickedAt = Date.now(); send("control", { action: "stop" }); };
  $("take").onclick = () => send("control", { action: "take_over" });
  $("release").onclick = () => send("control", { action: "release" });
  $("say-form").onsubmit = (event) => {
    event.preventDefault();
    const text = $("say").value;
    if (text.trim() === "") return;
    $("say").value = "";
    send("human", { text });
  };

  // --- viewers ------------------------------------------------------------------------------
  async function pollViewers() {
    try {
      const answer = await (await fetch(cfg.viewers, { cache: "no-store" })).json();
      w.viewers = answer.viewers;
      $("viewers").textContent = answer.viewers === null ? "?" : String(answer.viewers);
    } catch (error) {
      $("viewers").textContent = "?";
    }
  }

  $("stream").textContent = cfg.stream;
  document.title = `${cfg.stream} · edge watch`;
  $("me").title = me;
  w.nameOf = (id) => nameOf(id, false);
  update();
  connect();
  pollViewers();
  setInterval(pollViewers, 2000);
})();
