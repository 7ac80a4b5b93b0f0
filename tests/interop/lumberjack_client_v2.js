'use strict'
// Interop client for the lumberjack source: npm "lumberjack-client" (Lumberjack v2, each
// window one zlib C frame of J frames numbered 1..N, as Beats sends them).
//
// usage: node lumberjack_client_v2.js HOST PORT QUEUED SINGLES
//
// QUEUED events are logged before the connection is up: the client queues them and sends
// them as one window once connected. SINGLES more are logged one by one afterwards, each
// its own window, without waiting for acks (the client never reads them). This script
// reads the acks itself from the client's socket and exits 0 once every window got its
// final ack (one per window, in order; ACK 0 keepalives and partial acks are allowed).
// It prints one JSON line: {"acks": [...]} or {"error": "..."}; exit 2 on timeout.
const LumberjackClient = require('lumberjack-client')

const [host, port, queued, singles] = process.argv.slice(2)
const expected = [Number(queued), ...Array(Number(singles)).fill(1)].filter((n) => n > 0)
const acks = []

function finish(code, extra) {
  console.log(JSON.stringify({acks, ...extra}))
  process.exit(code)
}

setTimeout(() => finish(2, {error: 'timed out waiting for acks', pending: expected}), 30000)

const client = new LumberjackClient({host, port: Number(port)})
for (let i = 0; i < Number(queued); i++) {
  client.log({
    '@timestamp': '2024-01-02T03:04:05.678Z',
    '@metadata': {beat: 'nodebeat', version: '1.0.3'},
    message: `queued ${i}`,
    n: i,
    nested: {ok: true, list: [1, 'two']},
  })
}

let buffer = Buffer.alloc(0)
client.socket.on('data', (data) => {
  buffer = Buffer.concat([buffer, data])
  while (buffer.length >= 6) {
    const version = String.fromCharCode(buffer[0])
    const type = String.fromCharCode(buffer[1])
    const seq = buffer.readUInt32BE(2)
    buffer = buffer.subarray(6)
    if (version !== '2' || type !== 'A') finish(3, {error: `unexpected frame ${version}${type}`})
    acks.push(seq)
    if (seq === 0 || seq < expected[0]) continue // keepalive or partial ack
    if (seq !== expected[0]) finish(3, {error: `ack ${seq} but the window holds ${expected[0]}`})
    expected.shift()
    if (expected.length === 0) finish(0)
  }
})
client.socket.on('error', (err) => finish(3, {error: err.message}))
client.socket.on('connect', () => {
  // The client flushed its queue (one window) in its own connect handler, which ran first.
  for (let i = 0; i < Number(singles); i++) {
    client.log({message: `single ${i}`, n: Number(queued) + i, '@metadata': {beat: 'nodebeat'}})
  }
})
