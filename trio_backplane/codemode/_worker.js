// The Code Mode worker: JSON lines in, JSON lines out, no permissions.
// {"id", "code"} runs `code` as an async function body; the reply is
// {"id", "ok": true, "value", "output"} or {"id", "ok": false, "error", "message", "output"}.
// Inside, `tools.<name>(args)` sends {"call", "tool", "args"} and resolves
// with the host's {"reply", "ok": true, "value"} (or rejects with its error).
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
const OUTPUT_LIMIT = 65536;

function send(message) {
  Deno.stdout.writeSync(encoder.encode(JSON.stringify(message) + "\n"));
}

function bounded() {
  const lines = [];
  let used = 0;
  let cut = false;
  const log = (...parts) => {
    const line = parts.map((p) => (typeof p === "string" ? p : JSON.stringify(p))).join(" ");
    if (cut || used + line.length > OUTPUT_LIMIT) {
      cut = true;
      return;
    }
    used += line.length;
    lines.push(line);
  };
  return { console: { log, info: log, warn: log, error: log }, lines, truncated: () => cut };
}

const calls = new Map();
let lastCall = 0;

function callTool(name, args) {
  const call = ++lastCall;
  send({ call, tool: name, args: args === undefined ? {} : args });
  return new Promise((resolve, reject) => calls.set(call, { resolve, reject }));
}

const tools = new Proxy({}, { get: (_, name) => (args) => callTool(String(name), args) });

function settle(reply) {
  const waiter = calls.get(reply.reply);
  if (waiter === undefined) return;
  calls.delete(reply.reply);
  if (reply.ok) {
    waiter.resolve(reply.value);
  } else {
    const error = new Error(reply.message);
    error.name = reply.error;
    waiter.reject(error);
  }
}

async function run(message) {
  const out = bounded();
  try {
    const cell = new AsyncFunction("console", "tools", message.code);
    const value = await cell(out.console, tools);
    const text = value === undefined ? null : JSON.stringify(value);
    send({ id: message.id, ok: true, value: text === null ? null : JSON.parse(text), output: out.lines, truncated: out.truncated() });
  } catch (error) {
    const name = error && error.name ? String(error.name) : "Error";
    const text = error && error.message ? String(error.message) : String(error);
    send({ id: message.id, ok: false, error: name, message: text.slice(0, 2000), output: out.lines, truncated: out.truncated() });
  }
}

// A cell cannot end the worker: the host decides when it stops.
Deno.exit = () => {
  throw new Error("Deno.exit is not available in a cell");
};

let pending = "";
for await (const chunk of Deno.stdin.readable) {
  pending += decoder.decode(chunk, { stream: true });
  let end;
  while ((end = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, end);
    pending = pending.slice(end + 1);
    const message = JSON.parse(line);
    // replies arrive while a cell awaits them: never block the reading
    if ("reply" in message) settle(message);
    else run(message);
  }
}
