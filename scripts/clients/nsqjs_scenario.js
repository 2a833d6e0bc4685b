#!/usr/bin/env node
// Runs the Node.js client nsqjs (unmodified) against an nsqd.
//
// usage: node nsqjs_scenario.js <nsqd-tcp-host:port> <nsqd-http-host:port>
//
// 1. fan-out: 10,000 distinct messages (PUB, DPUB and MPUB through nsq.Writer) to a new
//    topic with two channels (created first over HTTP) and two nsq.Reader per channel
//    (maxInFlight 16 and 200). Every message must reach every channel and be FIN'd; a
//    message may arrive twice only if it was redelivered (attempts > 1). /stats must then
//    show each channel drained, message_count 10,000 and 10,000 FINs.
// 2. redelivery: 50 messages to a new topic with channel "requeue", whose Reader REQs
//    (delay 0) each first delivery, and channel "timeout", whose Reader (IDENTIFY
//    msg_timeout 1000 ms) never answers a first delivery. Both must get every message
//    again with the same id and attempts > 1, and FIN it.
//
// Exit status 0 on success, 1 with a reason on stderr otherwise; gives up after
// SCENARIO_TIMEOUT seconds (default 120).
'use strict'

const nsq = require('nsqjs')

const NAME = 'nsqjs'
const FANOUT_MESSAGES = parseInt(process.env.SCENARIO_MESSAGES || '10000', 10)
const RETRY_MESSAGES = parseInt(process.env.SCENARIO_RETRY_MESSAGES || '50', 10)
const OVERALL_TIMEOUT = parseFloat(process.env.SCENARIO_TIMEOUT || '120')

const DPUB_DELAY_MS = 50
const DPUB_FIRST = 1000 // bodies [1000, 1100) are published with DPUB
const DPUB_END = 1100

class ScenarioError extends Error {}

function log(text) {
  const t = new Date().toISOString().slice(11, 19)
  process.stderr.write(`[${NAME} ${t}] ${text}\n`)
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

function uniqueName(prefix) {
  return `${prefix}_${process.pid}_${Date.now() % 1e9}`.slice(0, 64)
}

// Same bodies as scenario_common.make_bodies: some 64 KiB, some binary.
function makeBodies(topic, n) {
  const all = Buffer.alloc(256)
  for (let i = 0; i < 256; i++) all[i] = i
  const out = []
  for (let i = 0; i < n; i++) {
    let b = Buffer.from(`${topic}:${String(i).padStart(6, '0')}:`)
    if (i % 997 === 5) b = Buffer.concat([b, Buffer.concat(Array(256).fill(all))])
    else if (i % 101 === 7) b = Buffer.concat([b, Buffer.from('\n\x00\r\n binary \xff\xfe', 'latin1')])
    out.push(b)
  }
  return out
}

const key = (buf) => buf.toString('latin1')

// ------------------------------------------------------------------------- HTTP
async function http(addr, method, path) {
  const ctl = new AbortController()
  const timer = setTimeout(() => ctl.abort(), 10000)
  try {
    const r = await fetch(`http://${addr}${path}`, {method, signal: ctl.signal})
    return {code: r.status, body: Buffer.from(await r.arrayBuffer())}
  } catch (e) {
    throw new ScenarioError(`${method} ${path}: ${e.message}`)
  } finally {
    clearTimeout(timer)
  }
}

async function createTopicChannels(addr, topic, channels) {
  const q = encodeURIComponent
  let r = await http(addr, 'POST', `/topic/create?topic=${q(topic)}`)
  if (r.code !== 200) throw new ScenarioError(`POST /topic/create?topic=${topic} -> ${r.code} ${r.body}`)
  for (const ch of channels) {
    r = await http(addr, 'POST', `/channel/create?topic=${q(topic)}&channel=${q(ch)}`)
    if (r.code !== 200) {
      throw new ScenarioError(`POST /channel/create?topic=${topic}&channel=${ch} -> ${r.code} ${r.body}`)
    }
  }
}

async function channelStats(addr, topic, channel) {
  const r = await http(addr, 'GET', '/stats?format=json')
  if (r.code !== 200) throw new ScenarioError(`GET /stats?format=json -> ${r.code} ${r.body}`)
  let data = JSON.parse(r.body.toString())
  if (data.data && !data.topics) data = data.data
  const t = (data.topics || []).find((x) => x.topic_name === topic)
  if (!t) throw new ScenarioError(`topic ${topic} missing from /stats`)
  const c = (t.channels || []).find((x) => x.channel_name === channel)
  if (!c) throw new ScenarioError(`channel ${topic}/${channel} missing from /stats`)
  return c
}

function summarize(c) {
  const s = {}
  for (const k of ['depth', 'backend_depth', 'in_flight_count', 'deferred_count', 'message_count',
    'requeue_count', 'timeout_count']) s[k] = c[k]
  s.clients = (c.clients || []).map((cl) => ({
    client_id: cl.client_id, ready_count: cl.ready_count, in_flight_count: cl.in_flight_count,
    message_count: cl.message_count, finish_count: cl.finish_count, requeue_count: cl.requeue_count,
  }))
  return s
}

const sumClients = (c, k) => (c.clients || []).reduce((a, cl) => a + (cl[k] || 0), 0)

async function waitChannelDrained(addr, topic, channel, checks, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const c = await channelStats(addr, topic, channel)
    const drained = c.depth === 0 && c.in_flight_count === 0 && c.deferred_count === 0
    if (drained && checks(c).length === 0) return c
    if (Date.now() > deadline) {
      const problems = drained ? checks(c) : ['not drained (depth/in_flight/deferred not all 0)']
      throw new ScenarioError(`/stats for ${topic}/${channel}: ${problems.join('; ')}; ` +
        `stats=${JSON.stringify(summarize(c))}`)
    }
    await sleep(200)
  }
}

// ------------------------------------------------------------------ bookkeeping
class ChannelTracker {
  constructor(channel, bodies) {
    this.channel = channel
    this.expected = new Set(bodies.map(key))
    this.deferred = new Set(bodies.slice(DPUB_FIRST, DPUB_END).map(key))
    this.deliveries = new Map() // body key -> [{attempts, id, consumer}]
    this.unknown = []
    this.finsSent = 0
  }

  record(msg, consumer) {
    const k = key(msg.body)
    if (!this.expected.has(k)) {
      this.unknown.push([k.slice(0, 80), msg.attempts, msg.id])
      return 0
    }
    if (!this.deliveries.has(k)) this.deliveries.set(k, [])
    const ds = this.deliveries.get(k)
    // receipt time minus the message's timestamp (nsqd's publish time, in ns)
    const ageMs = Number(BigInt(Date.now()) * 1000000n - BigInt(msg.timestamp)) / 1e6
    ds.push({attempts: msg.attempts, id: msg.id, consumer, ageMs})
    return ds.length
  }

  complete() {
    return this.deliveries.size === this.expected.size
  }

  allRedelivered() {
    if (!this.complete()) return false
    for (const ds of this.deliveries.values()) if (ds.length < 2) return false
    return true
  }

  progress() {
    let n = 0
    for (const ds of this.deliveries.values()) n += ds.length
    return `${this.channel}: ${this.deliveries.size}/${this.expected.size} distinct, ${n} deliveries`
  }

  duplicates() {
    let n = 0
    for (const ds of this.deliveries.values()) n += ds.length - 1
    return n
  }

  histogram() {
    const h = {}
    for (const ds of this.deliveries.values()) for (const d of ds) h[d.attempts] = (h[d.attempts] || 0) + 1
    return JSON.stringify(h)
  }

  problemsFanout() {
    const p = []
    if (this.unknown.length) p.push(`${this.unknown.length} deliveries with unknown bodies, e.g. ${JSON.stringify(this.unknown.slice(0, 3))}`)
    const missing = [...this.expected].filter((k) => !this.deliveries.has(k))
    if (missing.length) p.push(`${missing.length} of ${this.expected.size} messages never delivered, e.g. ${JSON.stringify(missing.sort().slice(0, 3).map((k) => k.slice(0, 60)))}`)
    const badDup = [...this.deliveries.entries()].filter(([, ds]) => ds.length > 1 && ds.filter((d) => d.attempts <= 1).length > 1)
    if (badDup.length) p.push(`${badDup.length} messages delivered more than once with attempts=1 (not a requeue), e.g. ${JSON.stringify([badDup[0][0].slice(0, 40), badDup[0][1]])}`)
    const firstAtt = [...this.deliveries.values()].filter((ds) => ds[0].attempts !== 1)
    if (firstAtt.length) p.push(`${firstAtt.length} messages whose first delivery had attempts != 1, e.g. ${JSON.stringify(firstAtt[0])}`)
    const idChange = [...this.deliveries.values()].filter((ds) => new Set(ds.map((d) => d.id)).size > 1)
    if (idChange.length) p.push(`${idChange.length} messages changed id between deliveries`)
    p.push(...this.timestampProblems())
    const early = [...this.deliveries.entries()].filter(([k, ds]) => this.deferred.has(k) && ds[0].ageMs < DPUB_DELAY_MS - 5)
    if (early.length) p.push(`${early.length} DPUB (defer ${DPUB_DELAY_MS} ms) messages delivered too early, e.g. ${early.slice(0, 3).map(([k, ds]) => `${k.slice(0, 40)}: ${ds[0].ageMs} ms`).join(', ')} after their timestamp`)
    return p
  }

  timestampProblems() {
    const bad = []
    for (const [k, ds] of this.deliveries.entries()) {
      for (const d of ds) if (!(d.ageMs >= -1000 && d.ageMs <= 300000)) bad.push(`${k.slice(0, 40)}: ${d.ageMs} ms`)
    }
    return bad.length ? [`${bad.length} deliveries whose timestamp is not within [-1 s, 300 s] of now, e.g. ${bad.slice(0, 3).join(', ')}`] : []
  }

  problemsRedelivery(what) {
    const p = []
    if (this.unknown.length) p.push(`${this.unknown.length} deliveries with unknown bodies`)
    const never = [...this.expected].filter((k) => !this.deliveries.has(k))
    if (never.length) p.push(`${never.length} of ${this.expected.size} messages never delivered`)
    const once = [...this.deliveries.values()].filter((ds) => ds.length < 2)
    if (once.length) p.push(`${once.length} of ${this.expected.size} messages not redelivered after ${what}`)
    for (const [k, ds] of this.deliveries.entries()) {
      if (ds.length < 2) continue
      if (ds[0].attempts !== 1) {
        p.push(`first delivery of ${k.slice(0, 40)} had attempts=${ds[0].attempts} (want 1)`)
        break
      }
      if (!ds.slice(1).every((d) => d.attempts > 1)) {
        p.push(`redelivery of ${k.slice(0, 40)} after ${what} had attempts ${JSON.stringify(ds.map((d) => d.attempts))} (want > 1)`)
        break
      }
      if (new Set(ds.map((d) => d.id)).size !== 1) {
        p.push(`redelivery of ${k.slice(0, 40)} after ${what} changed the message id: ${JSON.stringify(ds.map((d) => d.id))}`)
        break
      }
    }
    p.push(...this.timestampProblems())
    return p
  }
}

function fanoutChecks(tracker, n) {
  return (c) => {
    const p = []
    if (c.message_count !== n) p.push(`message_count=${c.message_count}, want ${n}`)
    const fin = sumClients(c, 'finish_count')
    if (fin !== n) p.push(`sum of clients' finish_count=${fin}, want ${n} (FINs sent: ${tracker.finsSent})`)
    if (tracker.duplicates() === 0 && (c.requeue_count || c.timeout_count)) {
      p.push(`requeue_count=${c.requeue_count} timeout_count=${c.timeout_count} but no message was redelivered`)
    }
    return p
  }
}

function retryChecks(n, kind) {
  return (c) => {
    const p = []
    if (c.message_count !== n) p.push(`message_count=${c.message_count}, want ${n}`)
    if (kind === 'requeue' && c.requeue_count !== n) p.push(`requeue_count=${c.requeue_count}, want ${n}`)
    if (kind === 'timeout' && !((c.timeout_count || 0) >= n)) p.push(`timeout_count=${c.timeout_count}, want >= ${n}`)
    const fin = sumClients(c, 'finish_count')
    if (fin !== n) p.push(`sum of clients' finish_count=${fin}, want ${n}`)
    return p
  }
}

// ---------------------------------------------------------------------- clients
const errors = []

function splitAddr(addr) {
  const i = addr.lastIndexOf(':')
  return [addr.slice(0, i), parseInt(addr.slice(i + 1), 10)]
}

async function waitFor(cond, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  while (!cond()) {
    if (Date.now() > deadline) throw new ScenarioError(`timed out after ${timeoutMs / 1000}s waiting for ${what}`)
    await sleep(50)
  }
}

async function startReader(topic, channel, tcp, opts, onMessage, label) {
  const r = new nsq.Reader(topic, channel, Object.assign({
    nsqdTCPAddresses: [tcp], maxAttempts: 0, lookupdPollInterval: 60,
  }, opts))
  let connected = false
  r.on('nsqd_connected', () => { connected = true })
  r.on('error', (err) => { errors.push(`reader ${label}: ${err.message || err}`); log(`reader ${label} error: ${err.message || err}`) })
  // The scenario never closes a connection itself, so a close means the broker did.
  r.on('nsqd_closed', () => { errors.push(`reader ${label}: connection closed by nsqd`); log(`reader ${label}: connection closed`) })
  r.on('discard', (msg) => errors.push(`reader ${label}: discarded message attempts=${msg.attempts}`))
  r.on('message', (msg) => onMessage(msg))
  r.connect()
  await waitFor(() => connected, 10000, `reader ${label} to connect`)
  return r
}

async function startWriter(tcp) {
  const [host, port] = splitAddr(tcp)
  const w = new nsq.Writer(host, port, {})
  const ready = new Promise((resolve, reject) => {
    w.once('ready', resolve)
    w.once('error', reject)
  })
  w.on('error', (err) => errors.push(`writer: ${err.message || err}`))
  w.on('closed', () => { errors.push('writer: connection closed by nsqd'); log('writer: connection closed') })
  w.connect()
  await Promise.race([ready, sleep(10000).then(() => { throw new ScenarioError('writer did not connect in 10s') })])
  return w
}

class Publisher {
  constructor(writer, topic, window = 256) {
    Object.assign(this, {w: writer, topic, window, outstanding: 0, failures: [], waiters: []})
  }

  cb(err) {
    this.outstanding--
    if (err) this.failures.push(err.message || String(err))
    while (this.waiters.length && this.outstanding < this.window) this.waiters.shift()()
  }

  async slot() {
    if (this.failures.length) throw new ScenarioError(`publish failed: ${this.failures.slice(0, 3)}`)
    while (this.outstanding >= this.window) await new Promise((resolve) => this.waiters.push(resolve))
    this.outstanding++
  }

  async pub(body) { await this.slot(); this.w.publish(this.topic, body, (e) => this.cb(e)) }
  // nsqjs 0.13.0's deferPublish hands `msg` to produceMessages unchanged, which wants an array.
  async dpub(ms, body) { await this.slot(); this.w.deferPublish(this.topic, [body], ms, (e) => this.cb(e)) }
  async mpub(bodies) { await this.slot(); this.w.publish(this.topic, bodies, (e) => this.cb(e)) }

  async drain() {
    await waitFor(() => this.outstanding === 0 || this.failures.length, 30000, 'publish responses')
    if (this.failures.length) throw new ScenarioError(`publish failed: ${this.failures.slice(0, 3)}`)
  }
}

async function progressUntil(cond, trackers, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  let next = Date.now() + 5000
  while (!cond()) {
    if (errors.length) throw new ScenarioError(`client errors: ${errors.slice(0, 5).join('; ')}`)
    if (Date.now() > deadline) throw new ScenarioError(`timed out waiting for ${what}; ${trackers.map((t) => t.progress()).join('; ')}`)
    if (Date.now() > next) {
      log(`progress: ${trackers.map((t) => t.progress()).join('; ')}`)
      next = Date.now() + 5000
    }
    await sleep(20)
  }
}

async function fanout(tcp, httpAddr, timeoutMs, keep) {
  const n = FANOUT_MESSAGES
  const topic = uniqueName('nsqjs_fanout')
  const channels = ['ch_a', 'ch_b']
  log(`fan-out: topic ${topic}, channels ${channels}, ${n} messages, 2 consumers per channel`)
  await createTopicChannels(httpAddr, topic, channels)
  const bodies = makeBodies(topic, n)
  const trackers = {}
  for (const ch of channels) trackers[ch] = new ChannelTracker(ch, bodies)
  for (const ch of channels) {
    for (const [k, mif] of [16, 200].entries()) {
      const label = `${ch}/${k}`
      keep.push(await startReader(topic, ch, tcp, {maxInFlight: mif}, (msg) => {
        trackers[ch].record(msg, label)
        trackers[ch].finsSent++
        msg.finish()
      }, label))
    }
  }
  const writer = await startWriter(tcp)
  keep.push(writer)
  const pub = new Publisher(writer, topic)
  const t0 = Date.now()
  // First 1,000 by PUB, next 100 by DPUB (50 ms), the rest by MPUB of 100.
  let i = 0
  for (; i < Math.min(n, DPUB_FIRST); i++) await pub.pub(bodies[i])
  for (; i < Math.min(n, DPUB_END); i++) await pub.dpub(DPUB_DELAY_MS, bodies[i])
  for (; i < n; i += 100) await pub.mpub(bodies.slice(i, i + 100))
  await pub.drain()
  if (errors.length) throw new ScenarioError(`client errors: ${errors.slice(0, 5).join('; ')}`)
  log(`fan-out: published ${n} messages in ${((Date.now() - t0) / 1000).toFixed(1)}s`)
  const tr = Object.values(trackers)
  await progressUntil(() => tr.every((t) => t.complete()), tr, timeoutMs, 'every message on every channel')
  log(`fan-out: all delivered in ${((Date.now() - t0) / 1000).toFixed(1)}s`)
  const problems = []
  for (const ch of channels) problems.push(...trackers[ch].problemsFanout().map((p) => `${ch}: ${p}`))
  if (problems.length) throw new ScenarioError(`fan-out: ${problems.join('; ')}`)
  for (const ch of channels) {
    const t = trackers[ch]
    const c = await waitChannelDrained(httpAddr, topic, ch, fanoutChecks(t, n))
    log(`fan-out: ${ch} ok: ${n + t.duplicates()} deliveries (${t.duplicates()} redelivered), attempts ${t.histogram()}, stats requeue=${c.requeue_count} timeout=${c.timeout_count}`)
  }
}

async function redelivery(tcp, httpAddr, timeoutMs, keep) {
  const n = RETRY_MESSAGES
  const topic = uniqueName('nsqjs_retry')
  log(`redelivery: topic ${topic}, ${n} messages, channels requeue (REQ 0) and timeout (msg_timeout 1000ms)`)
  await createTopicChannels(httpAddr, topic, ['requeue', 'timeout'])
  const bodies = makeBodies(topic, n)
  const reqTr = new ChannelTracker('requeue', bodies)
  const toTr = new ChannelTracker('timeout', bodies)
  keep.push(await startReader(topic, 'requeue', tcp, {maxInFlight: 10}, (msg) => {
    if (reqTr.record(msg, 'requeue') === 1) {
      msg.requeue(0, false)
    } else {
      reqTr.finsSent++
      msg.finish()
    }
  }, 'requeue'))
  keep.push(await startReader(topic, 'timeout', tcp, {maxInFlight: 4 * n, messageTimeout: 1000}, (msg) => {
    // first delivery: never answered, so nsqd must time it out
    if (toTr.record(msg, 'timeout') > 1) {
      toTr.finsSent++
      msg.finish()
    }
  }, 'timeout'))
  const writer = await startWriter(tcp)
  keep.push(writer)
  const pub = new Publisher(writer, topic)
  for (const b of bodies) await pub.pub(b)
  await pub.drain()
  const t0 = Date.now()
  await progressUntil(() => reqTr.allRedelivered() && toTr.allRedelivered(), [reqTr, toTr], timeoutMs,
    'every message redelivered on both channels')
  log(`redelivery: all redelivered in ${((Date.now() - t0) / 1000).toFixed(1)}s`)
  const problems = reqTr.problemsRedelivery('REQ').map((p) => `requeue: ${p}`)
    .concat(toTr.problemsRedelivery('msg_timeout').map((p) => `timeout: ${p}`))
  if (problems.length) throw new ScenarioError(`redelivery: ${problems.join('; ')}`)
  await waitChannelDrained(httpAddr, topic, 'requeue', retryChecks(n, 'requeue'))
  await waitChannelDrained(httpAddr, topic, 'timeout', retryChecks(n, 'timeout'))
  log(`redelivery: ok; requeue attempts ${reqTr.histogram()}, timeout attempts ${toTr.histogram()}`)
}

async function main() {
  const [tcp, httpAddr] = process.argv.slice(2)
  if (!tcp || !httpAddr || !tcp.includes(':') || !httpAddr.includes(':') || process.argv.length !== 4) {
    process.stderr.write('usage: nsqjs_scenario.js <nsqd-tcp-host:port> <nsqd-http-host:port>\n')
    process.exit(2)
  }
  log(`nsqjs ${require('nsqjs/package.json').version}, node ${process.version}`)
  const t0 = Date.now()
  const overall = setTimeout(() => {
    log(`FAIL: overall timeout (${OVERALL_TIMEOUT + 30}s)`)
    process.exit(1)
  }, (OVERALL_TIMEOUT + 30) * 1000)
  const deadline = Date.now() + OVERALL_TIMEOUT * 1000
  const keep = [] // readers/writers stay connected until exit
  try {
    await fanout(tcp, httpAddr, Math.max(1000, deadline - Date.now()), keep)
    await redelivery(tcp, httpAddr, Math.max(1000, deadline - Date.now()), keep)
    if (errors.length) throw new ScenarioError(`client errors: ${errors.slice(0, 5).join('; ')}`)
  } catch (e) {
    log(`FAIL: ${e instanceof ScenarioError ? e.message : e.stack}`)
    process.exit(1)
  }
  clearTimeout(overall)
  log(`PASS (${((Date.now() - t0) / 1000).toFixed(1)}s)`)
  process.exit(0)
}

main()
