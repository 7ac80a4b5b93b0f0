"use strict";
// Sends events to a forward server with @fluent-org/logger (fluent-logger-forward-node).
//
//   node fluent_org_client.js '<json settings>'
//
// Settings: host, port, tagPrefix, label, count, t0 (seconds), eventMode ("Message",
// "Forward", "PackedForward", "CompressedPackedForward"), ack (bool), ackTimeoutMs,
// tls {ca, cert?, key?, servername?} (PEM paths), security {clientHostname, sharedKey,
// username?, password?}, timeoutMs (watchdog for the whole run).
//
// Prints one JSON line on stdout: {"ok": true, "sent": N} or {"ok": false, "error": …}.
// Exit status: 0 sent (and acked when ack is on), 1 client error, 2 socket error
// (refused handshake, TLS alert, …), 3 watchdog timeout. Never retries or reconnects.
const fs = require("fs");
const { FluentClient, EventTime } = require("@fluent-org/logger");

const cfg = JSON.parse(process.argv[2] || "{}");

function finish(result, code) {
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(code));
}

setTimeout(() => finish({ ok: false, error: "watchdog timeout" }, 3), cfg.timeoutMs || 30000).unref();

const socket = { host: cfg.host || "127.0.0.1", port: cfg.port, timeout: 15000, disableReconnect: true };
if (cfg.tls) {
  socket.tls = { ca: fs.readFileSync(cfg.tls.ca), servername: cfg.tls.servername || "localhost" };
  if (cfg.tls.cert) {
    socket.tls.cert = fs.readFileSync(cfg.tls.cert);
    socket.tls.key = fs.readFileSync(cfg.tls.key);
  }
}
const options = { socket, eventMode: cfg.eventMode || "PackedForward" };
if (cfg.ack) options.ack = { ackTimeout: cfg.ackTimeoutMs || 20000 };
if (cfg.security) options.security = cfg.security;

const client = new FluentClient(cfg.tagPrefix || "interop", options);
const socketFailed = new Promise((_, reject) => client.socketOn("error", (err) => reject(Object.assign(err, { fromSocket: true }))));
socketFailed.catch(() => {});

async function main() {
  await Promise.race([client.connect(), socketFailed]);
  const count = cfg.count || 10;
  const t0 = cfg.t0 || 1700000000;
  const emits = [];
  for (let i = 0; i < count; i++) {
    const record = { seq: i, msg: `fluent-org ${i}`, client: "@fluent-org/logger" };
    emits.push(client.emit(cfg.label || "events", record, new EventTime(t0 + i, 123456789)));
  }
  await Promise.race([Promise.all(emits), socketFailed]);
  await Promise.race([client.disconnect(), socketFailed]);
  finish({ ok: true, sent: count }, 0);
}

main().catch((err) => {
  finish({ ok: false, name: err && err.name, error: String((err && err.message) || err) }, err && err.fromSocket ? 2 : 1);
});
