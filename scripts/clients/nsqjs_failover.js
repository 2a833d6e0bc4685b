#!/usr/bin/env node
// A replicated topic's leader lost, as the Node.js client nsqjs (unmodified) sees it
// (docs/replication.md).
//
// usage: node nsqjs_failover.js <nsqlookupd-http-host:port> <nsqd-tcp-host:port>...
//
// As scripts/clients/pynsq_failover.py, with nsqjs: one nsq.Writer per member (an nsqjs
// Writer talks to one nsqd) publishes SCENARIO_MESSAGES (default 200) distinct messages,
// a failed publish retried through the next member; an nsq.Reader finds the topic
// through nsqlookupd and FINs what it gets. Once it has every acknowledged message, the
// script prints `KILL` on stdout and waits for a line on stdin (the caller kills the
// leader meanwhile); then as many again are published through the survivors, and the
// reader must receive every acknowledged message (redeliveries are counted).
//
// Exit status 0 on success, 1 with a reason on stderr otherwise; gives up after
// SCENARIO_TIMEOUT seconds (default 120).
'use strict'

const nsq = require('nsqjs')
const readline = require('readline')

const NAME = 'nsqjs-failover'
const N = parseInt(process.env.SCENARIO_MESSAGES || '200', 10)
const OVERALL_TIMEOUT = parseFloat(process.env.SCENARIO_TIMEOUT || '120')

class ScenarioError extends Error {}

function log (text) {
  const t = new Date().toISOString().slice(11, 19)
  process.stderr.write(`[${NAME} ${t}] ${text}\n`)
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (cond, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  while (!cond()) {
    if (Date.now() > deadline) throw new ScenarioError(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

function writer (addr) {
  const [host, port] = addr.split(':')
  const w = new nsq.Writer(host, parseInt(port, 10), {})
  w.ready = false
  w.on('ready', () => { w.ready = true })
  w.on('closed', () => { w.ready = false })
  w.on('error', () => {})
  w.connect()
  return w
}

function publish (w, topic, body) {
  return new Promise((resolve) => {
    if (!w.ready) return resolve(false)
    const timer = setTimeout(() => resolve(false), 10000)
    try {
      w.publish(topic, body, (err) => { clearTimeout(timer); resolve(!err) })
    } catch (e) {
      clearTimeout(timer)
      resolve(false)
    }
  })
}

async function publishAll (writers, topic, bodies, acked) {
  let next = 0
  for (const b of bodies) {
    const deadline = Date.now() + 30000
    for (;;) {
      const w = writers[next++ % writers.length]
      if (await publish(w, topic, b)) {
        acked.add(b)
        break
      }
      if (Date.now() > deadline) throw new ScenarioError(`no member acknowledged ${b}`)
      await sleep(50)
    }
  }
}

async function main (lookupd, members) {
  const topic = `nfailover_${process.pid}_${Date.now() % 100000}`
  const writers = members.map(writer)
  await waitFor(() => writers.every((w) => w.ready), 20000, 'every writer to connect')
  const acked = new Set()
  const first = Array.from({ length: N }, (_, i) => `${topic}:a:${String(i).padStart(5, '0')}`)
  await publishAll(writers, topic, first, acked)
  const got = new Map()
  const reader = new nsq.Reader(topic, 'c', {
    lookupdHTTPAddresses: [lookupd],
    lookupdPollInterval: 1,
    lookupdPollJitter: 0.1,
    maxInFlight: 50,
    maxAttempts: 0
  })
  reader.on('message', (msg) => {
    const b = msg.body.toString()
    got.set(b, (got.get(b) || 0) + 1)
    msg.finish()
  })
  reader.on('error', () => {})
  reader.on('nsqd_closed', () => {})
  reader.connect()
  const all = () => [...acked].every((b) => got.has(b))
  await waitFor(all, OVERALL_TIMEOUT * 1000, 'the first round')
  log(`first round: ${acked.size} acknowledged, all received; kill the leader now`)
  process.stdout.write('KILL\n')
  await new Promise((resolve) => readline.createInterface({ input: process.stdin }).once('line', resolve))
  const t0 = Date.now()
  const second = Array.from({ length: N }, (_, i) => `${topic}:b:${String(i).padStart(5, '0')}`)
  await publishAll(writers, topic, second, acked)
  log(`second round published through the survivors in ${((Date.now() - t0) / 1000).toFixed(2)}s`)
  await waitFor(all, OVERALL_TIMEOUT * 1000, 'every acknowledged message')
  const known = new Set([...first, ...second])
  const extra = [...got.keys()].filter((b) => !known.has(b))
  if (extra.length) throw new ScenarioError(`received messages never published: ${extra.slice(0, 3)}`)
  let dups = 0
  for (const n of got.values()) dups += n - 1
  log(`all ${acked.size} acknowledged messages received after the failover ` +
      `(${((Date.now() - t0) / 1000).toFixed(2)}s), ${dups} redelivered`)
}

if (process.argv.length < 4) {
  process.stderr.write('usage: node nsqjs_failover.js <nsqlookupd-http> <nsqd-tcp>...\n')
  process.exit(2)
}
const t0 = Date.now()
const overall = setTimeout(() => { log(`FAIL: overall timeout (${OVERALL_TIMEOUT + 30}s)`); process.exit(1) },
  (OVERALL_TIMEOUT + 30) * 1000)
main(process.argv[2], process.argv.slice(3)).then(() => {
  clearTimeout(overall)
  log(`PASS (${((Date.now() - t0) / 1000).toFixed(1)}s)`)
  process.exit(0)
}, (e) => {
  log(`FAIL: ${e.message}`)
  process.exit(1)
})
