"use strict";
// Sends events to a forward server with the older npm client fluent-logger (fluent-logger-node).
//
//   node fluent_logger_client.js '<json settings>'
//
// Settings: host, port, tagPrefix, label, count, t0 (seconds), eventMode ("Message",
// "PackedForward", "CompressedPackedForward"), ack (bool: requireAckResponse),
// tls {ca, cert?, key?, servername?} (PEM paths), security {clientHostname, sharedKey,
// username?, password?}, timeoutMs (watchdog for the whole run).
//
// Prints one JSON line on stdout: {"ok": true, "sent": N} or {"ok": false, "error": …}.
// Exit status: 0 sent (and acked when ack is on), 2 client/socket error, 3 watchdog
// timeout. Reconnection is off, so a refused connection ends the run.
const fs = require("fs");
const logger = require("fluent-logger");

const cfg = JSON.parse(process.argv[2] || "{}");

function finish(result, code) {
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(code));
}

setTimeout(() => finish({ ok: false, error: "watchdog timeout" }, 3), cfg.timeoutMs || 30000).unref();

// The client logs its handshake steps through internalLogger; keep stdout for the result.
const quiet = { info: (...a) => console.error(...a), error: (...a) => console.error(...a) };
const options = {
  host: cfg.host || "127.0.0.1",
  port: cfg.port,
  eventMode: cfg.eventMode || "Message",
  requireAckResponse: !!cfg.ack,
  ackResponseTimeout: cfg.ackTimeoutMs || 20000,
  enableReconnect: false,
  internalLogger: quiet,
};
if (cfg.security) options.security = cfg.security;
if (cfg.tls) {
  options.tls = true;
  options.tlsOptions = { ca: fs.readFileSync(cfg.tls.ca), servername: cfg.tls.servername || "localhost" };
  if (cfg.tls.cert) {
    options.tlsOptions.cert = fs.readFileSync(cfg.tls.cert);
    options.tlsOptions.key = fs.readFileSync(cfg.tls.key);
  }
}

const sender = logger.createFluentSender(cfg.tagPrefix || "interop", options);
sender.on("error", (err) => finish({ ok: false, name: err && err.name, error: String((err && err.message) || err) }, 2));

const count = cfg.count || 10;
const t0 = cfg.t0 || 1700000000;
let done = 0;
for (let i = 0; i < count; i++) {
  const record = { seq: i, msg: `fluent-logger ${i}`, client: "fluent-logger" };
  sender.emit(cfg.label || "events", record, new logger.EventTime(t0 + i, 987654321), (err) => {
    if (err) return; // reported through the "error" event
    done += 1;
    if (done === count) sender.end(null, null, () => finish({ ok: true, sent: count }, 0));
  });
}
