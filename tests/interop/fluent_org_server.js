"use strict";
// A forward server written by others: @fluent-org/logger's FluentServer, for our sink to send to.
//
//   node fluent_org_server.js '<json settings>'
//
// Settings: tls {key, cert, ca?, requestCert?} (PEM paths; with requestCert the client
// must present a certificate signed by ca), security {serverHostname, sharedKey,
// users? {name: password}} (the shared-key handshake; users turn on user auth),
// timeoutMs (watchdog: the server exits by itself after this long).
//
// Prints JSON lines on stdout: first {"listening": port}, then one line per event
// received: {"tag", "time": [seconds, nanos] or a number, "record"}. The server acks
// every chunk (FluentServer does that by itself). It exits when stdin closes.
const fs = require("fs");
const { FluentServer } = require("@fluent-org/logger");

const cfg = JSON.parse(process.argv[2] || "{}");

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function plain(value) {
  if (value instanceof Uint8Array) return { $bytes: Buffer.from(value).toString("base64") };
  if (Array.isArray(value)) return value.map(plain);
  if (value && typeof value === "object") {
    const copy = {};
    for (const [k, v] of Object.entries(value)) copy[k] = plain(v);
    return copy;
  }
  return value;
}

setTimeout(() => process.exit(3), cfg.timeoutMs || 60000).unref();

const options = { listenOptions: { port: 0, host: "127.0.0.1" } };
if (cfg.tls) {
  options.tlsOptions = { key: fs.readFileSync(cfg.tls.key), cert: fs.readFileSync(cfg.tls.cert) };
  if (cfg.tls.requestCert) {
    options.tlsOptions.requestCert = true;
    options.tlsOptions.rejectUnauthorized = true;
    options.tlsOptions.ca = fs.readFileSync(cfg.tls.ca);
  }
}
if (cfg.security) {
  options.security = { serverHostname: cfg.security.serverHostname, sharedKey: cfg.security.sharedKey };
  if (cfg.security.users) {
    options.security.authorize = true;
    options.security.userDict = cfg.security.users;
  }
}

const server = new FluentServer(options);
server.on("entry", (tag, time, record) => {
  const t = time && typeof time === "object" && "epoch" in time ? [time.epoch, time.nano] : time;
  out({ tag, time: t, record: plain(record) });
});
// A failed TLS handshake is the client's problem: note it, keep serving.
if (server.server && server.server.on) {
  server.server.on("tlsClientError", (err) => process.stderr.write(`tlsClientError: ${err.message}\n`));
}

server.listen().then(() => out({ listening: server.port }));

process.stdin.on("end", () => {
  server.close().then(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
});
process.stdin.resume();
