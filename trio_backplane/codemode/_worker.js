// The Code Mode worker: JSON lines in, JSON lines out, no permissions.
// Host -> worker: {"id", "code"} runs `code` as an async function body;
// {"reply", "ok": true, "value"} or {"reply", "ok": false, "error", "message"}
// answers a request.
// Worker -> host: {"log"} a line of output (as it is written, bounded);
// {"call", "tool", "args"} for `tools.<name>(args)`; {"call", "state", "key",
// "value"?} for `store` and `load`; then {"id", "ok": true, "value"} or
// {"id", "ok": false, "error", "message"} when the cell ends.
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
const OUTPUT_LIMIT = 65536;
const write = Deno.stdout.writeSync.bind(Deno.stdout);

function send(message) {
  const bytes = encoder.encode(JSON.stringify(message) + "\n");
  for (let sent = 0; sent < bytes.length; ) sent += write(bytes.subarray(sent));
}

function show(part) {
  if (typeof part === "string") return part;
  try {
    const text = JSON.stringify(part);
    return text === undefined ? String(part) : text;
  } catch {
    return String(part);
  }
}

let used = 0;
let cut = false;
function log(...parts) {
  if (cut) return;
  const line = parts.map(show).join(" ");
  if (used + line.length > OUTPUT_LIMIT) {
    cut = true;
    send({ log: `[output truncated at ${OUTPUT_LIMIT} characters]` });
    return;
  }
  used += line.length;
  send({ log: line });
}
const cellConsole = { log, info: log, warn: log, error: log, debug: log };
globalThis.console = cellConsole; // nothing a cell runs writes around the bound

const calls = new Map();
let lastCall = 0;

function request(message) {
  const call = ++lastCall;
  send({ call, ...message });
  return new Promise((resolve, reject) => calls.set(call, { resolve, reject }));
}

const tools = new Proxy({}, {
  get: (_, name) => (args) => request({ tool: String(name), args: args === undefined ? {} : args }),
});
const text = (value) => log(show(value));
const store = (key, value) => request({ state: "store", key: String(key), value: value === undefined ? null : value });
const load = (key) => request({ state: "load", key: String(key) });

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
  used = 0;
  cut = false;
  try {
    const cell = new AsyncFunction("console", "tools", "text", "store", "load", message.code);
    const value = await cell(cellConsole, tools, text, store, load);
    const json = value === undefined ? null : JSON.stringify(value);
    send({ id: message.id, ok: true, value: json === undefined || json === null ? null : JSON.parse(json) });
  } catch (error) {
    const name = error && error.name ? String(error.name) : "Error";
    const why = error && error.message ? String(error.message) : String(error);
    send({ id: message.id, ok: false, error: name.slice(0, 100), message: why.slice(0, 2000) });
  }
}

// A cell cannot end the worker: the host decides when it stops.  A promise
// the cell forgot to await may reject; that must not end the worker either.
globalThis.addEventListener("unhandledrejection", (event) => event.preventDefault());
const exit = Deno.exit.bind(Deno);
Deno.exit = () => {
  throw new Error("Deno.exit is not available in a cell");
};

let pending = "";
const buffer = new Uint8Array(65536);
let read;
// (Deno.stdin.read, not its ReadableStream: a reply is one short line, and
// the stream's machinery costs more than the line)
while ((read = await Deno.stdin.read(buffer)) !== null) {
  pending += decoder.decode(buffer.subarray(0, read), { stream: true });
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
// The host is gone (its end of stdin closed): so is the worker.
exit(0);
