#!/usr/bin/env node
// nsqjs (unmodified) with tls: true against a broker started with a certificate.
//
// usage: node nsqjs_tls.js <nsqd-binary> [shards]
//
// Makes a self-signed certificate for 127.0.0.1 with `openssl req` in a temporary
// directory, starts nsqd (--shards, default 2) with --tls-cert/--tls-key on loopback ports
// chosen by the kernel, then publishes SCENARIO_TLS_MESSAGES (default 1000) messages with
// an nsq.Writer (tls: true; PUB and MPUB) and receives every one with an nsq.Reader
// (tls: true), FINing each. /stats must show the reader's connection with tls true. With
// more than one shard the SUB and the first PUB move the TLS connections to the topic's
// shard. The broker is stopped with SIGTERM and must exit 0. Exit status 0 on success, 1
// with the reason on stderr; gives up after SCENARIO_TIMEOUT seconds (default 120).
'use strict'

const { spawn, execFileSync } = require('child_process')
const fs = require('fs')
const net = require('net')
const os = require('os')
const path = require('path')
const nsq = require('nsqjs')

const N = parseInt(process.env.SCENARIO_TLS_MESSAGES || '1000', 10)
const TIMEOUT = parseFloat(process.env.SCENARIO_TIMEOUT || '120')

const nsqdBin = process.argv[2]
const shards = process.argv[3] || '2'
if (!nsqdBin) {
  process.stderr.write('usage: node nsqjs_tls.js <nsqd-binary> [shards]\n')
  process.exit(2)
}

let broker = null
let dir = null

function log(text) {
  process.stderr.write(`[nsqjs-tls ${new Date().toISOString().slice(11, 19)}] ${text}\n`)
}

function finish(code, why) {
  if (why) process.stderr.write(`nsqjs TLS scenario FAILED: ${why}\n`)
  const done = (c) => {
    if (dir) fs.rmSync(dir, { recursive: true, force: true })
    process.exit(c)
  }
  if (broker && broker.exitCode === null) {
    broker.once('exit', (status) => {
      if (code === 0 && status !== 0) {
        process.stderr.write(`nsqd exited with ${status} after SIGTERM\n`)
        done(1)
      } else done(code)
    })
    broker.kill('SIGTERM')
    setTimeout(() => done(code || 1), 15000).unref()
  } else done(code)
}

setTimeout(() => finish(1, `timed out after ${TIMEOUT} s`), TIMEOUT * 1000).unref()

async function httpJson(addr, pathAndQuery) {
  const res = await fetch(`http://${addr}${pathAndQuery}`)
  if (res.status !== 200) throw new Error(`GET ${pathAndQuery}: ${res.status}`)
  return res.json()
}

function startBroker() {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'nsqjs-tls-'))
  const cert = path.join(dir, 'cert.pem')
  const key = path.join(dir, 'key.pem')
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', key, '-out', cert,
  ], { stdio: 'ignore' })
  fs.mkdirSync(path.join(dir, 'data'))
  return startOnFreePorts(cert, key)
}

// A loopback port the kernel just handed out (bound, then released).
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

function portAnswers(addr) {
  const i = addr.lastIndexOf(':')
  return new Promise((resolve) => {
    const c = net.connect(parseInt(addr.slice(i + 1), 10), addr.slice(0, i))
    c.on('connect', () => { c.destroy(); resolve(true) })
    c.on('error', () => resolve(false))
  })
}

// Starts the broker on ports picked beforehand and resolves once they answer, the way a
// user waits (not on a log line); a port taken meanwhile is retried on fresh ones.
async function startOnFreePorts(cert, key) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const tcp = `127.0.0.1:${await freePort()}`
    const http = `127.0.0.1:${await freePort()}`
    const https = `127.0.0.1:${await freePort()}`
    let text = ''
    let exited = null
    broker = spawn(nsqdBin, [
      `--tcp-address=${tcp}`, `--http-address=${http}`, `--https-address=${https}`,
      `--shards=${shards}`, `--data-path=${path.join(dir, 'data')}`,
      `--tls-cert=${cert}`, `--tls-key=${key}`,
    ], { stdio: ['ignore', 'ignore', 'pipe'] })
    broker.stderr.on('data', (chunk) => { text += chunk.toString() })
    broker.on('exit', (status) => { exited = status })
    const deadline = Date.now() + 60000
    while (exited === null && Date.now() < deadline) {
      if (await portAnswers(tcp) && await portAnswers(http)) return { tcp, http }
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    if (exited === null) throw new Error(`nsqd: ports did not answer within 60 s: ${text}`)
    if (!/address already in use/i.test(text)) throw new Error(`nsqd exited (${exited}): ${text}`)
  }
  throw new Error('nsqd: ports kept being taken')
}

async function main() {
  const { tcp, http } = await startBroker()
  const [host, port] = [tcp.slice(0, tcp.lastIndexOf(':')), parseInt(tcp.slice(tcp.lastIndexOf(':') + 1), 10)]
  const topic = `nsqjs_tls_${process.pid}`
  const tlsOpts = { tls: true, tlsVerification: false }
  log(`broker ${tcp} (${shards} shards), ${N} messages over TLS`)

  const got = new Set()
  const reader = new nsq.Reader(topic, 'c', {
    nsqdTCPAddresses: [tcp], maxInFlight: 100, ...tlsOpts,
  })
  const received = new Promise((resolve, reject) => {
    reader.on('message', (msg) => {
      got.add(msg.body.toString())
      msg.finish()
      if (got.size === N) resolve()
    })
    reader.on('error', (e) => reject(new Error(`reader: ${e}`)))
  })
  const ready = new Promise((resolve) => reader.on('nsqd_connected', resolve))
  reader.connect()
  await ready

  const writer = new nsq.Writer(host, port, tlsOpts)
  await new Promise((resolve, reject) => {
    writer.on('ready', resolve)
    writer.on('error', (e) => reject(new Error(`writer: ${e}`)))
    writer.connect()
  })
  const publish = (bodies) => new Promise((resolve, reject) =>
    writer.publish(topic, bodies, (err) => (err ? reject(err) : resolve())))
  const half = Math.floor(N / 2)
  for (let i = 0; i < half; i++) await publish(`m${i}`)
  const rest = []
  for (let i = half; i < N; i++) rest.push(`m${i}`)
  for (let i = 0; i < rest.length; i += 100) await publish(rest.slice(i, i + 100))
  await received
  for (let i = 0; i < N; i++) {
    if (!got.has(`m${i}`)) throw new Error(`message m${i} not received`)
  }

  const stats = await httpJson(http, `/stats?format=json&topic=${topic}&include_clients=true`)
  const t = (stats.topics || []).find((x) => x.topic_name === topic)
  const ch = t && (t.channels || []).find((c) => c.channel_name === 'c')
  if (!ch || !ch.clients || ch.clients.length !== 1) throw new Error(`/stats: no client on ${topic}/c`)
  if (ch.clients[0].tls !== true) throw new Error(`/stats: reader not on TLS: ${JSON.stringify(ch.clients[0])}`)
  log(`all ${N} messages received over TLS (${ch.clients[0].tls_version})`)
  writer.close()
  reader.close()
}

main().then(() => finish(0), (e) => finish(1, e && e.message ? e.message : String(e)))
