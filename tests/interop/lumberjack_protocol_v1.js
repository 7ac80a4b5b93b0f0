'use strict'
// Interop client for the lumberjack source: npm "lumberjack-protocol" (logstash-forwarder's
// Lumberjack v1 over TLS: one W frame per connection, then D frames whose sequence numbers
// keep counting; it only accepts acks with version byte '1').
//
// usage: node lumberjack_protocol_v1.js HOST PORT CA_PEM COUNT WINDOW [CLIENT_CERT CLIENT_KEY]
//
// Sends COUNT key/value events and exits 0 once the server acknowledged sequence COUNT.
// Prints one JSON line: {"acks": [...]} or {"error": "..."}; exit 2 on timeout, 3 when the
// connection failed or was closed (e.g. a client certificate the server refused).
const fs = require('fs')
const lumberjack = require('lumberjack-protocol')

const [host, port, ca, count, windowSize, cert, key] = process.argv.slice(2)
const acks = []

function finish(code, extra) {
  console.log(JSON.stringify({acks, ...extra}))
  process.exit(code)
}

setTimeout(() => finish(2, {error: 'timed out waiting for acks'}), 30000)

const options = {host, port: Number(port), ca: [fs.readFileSync(ca)]}
if (cert) {
  options.cert = fs.readFileSync(cert)
  options.key = fs.readFileSync(key)
}
const client = lumberjack.client(options, {
  windowSize: Number(windowSize),
  maxQueueSize: Number(count) + 1,
  reconnect: 60000,
})
client.on('connect', () => {
  client._socket.on('ack', (seq) => {
    acks.push(seq)
    if (seq >= Number(count)) finish(0)
  })
})
client.on('disconnect', (err) => finish(3, {error: err ? err.message || String(err) : 'connection closed'}))
client.on('dropped', (n) => finish(3, {error: `client dropped ${n} event(s)`}))
for (let i = 0; i < Number(count); i++) {
  client.writeDataFrame({line: `line ${i}`, file: '/var/log/app.log', offset: String(i * 10), 'ünï': 'cödé'})
}
