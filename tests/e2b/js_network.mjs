// E2B's network options through the official JS client (npm `e2b`), against
// `brig serve --e2b` in the test world of crates/cli/tests/network.rs (no
// packet leaves it): allowInternetAccess, network allowOut / denyOut (an
// allowOut entry beats a denyOut entry; domains need ALL_TRAFFIC),
// updateNetwork, getInfo, allowPublicTraffic's token and maskRequestHost.
//
// argv: the world's ALLOWED and OTHER addresses. Prints "ok NAME" per check
// and "N passed, M failed".
import { ALL_TRAFFIC, Sandbox, Secret } from 'e2b'
import { createHash } from 'node:crypto'
import { check, finish, rejection, section, show } from './sdk_checks.mjs'

const [ALLOWED, OTHER] = process.argv.slice(2)
const template = 'host'
const made = []
async function create(opts = {}) {
  const s = await Sandbox.create(template, { timeoutMs: 120_000, ...opts })
  made.push(s)
  return s
}

const FETCH = `
import sys, urllib.request
for u in sys.argv[1:]:
    try:
        print(u, urllib.request.urlopen(u, timeout=5).read().decode().replace('\\r', '').replace('\\n', '|'))
    except Exception as e:
        print(u, 'ERR', type(e).__name__)
`

// URL -> body, or null if the sandbox could not fetch it.
async function fetchIn(sbx, ...urls) {
  const quoted = "'" + FETCH.replaceAll("'", "'\\''") + "'"
  const r = await sbx.commands.run(`python3 -c ${quoted} ${urls.join(' ')}`, { timeoutMs: 60_000 })
  const got = {}
  for (const line of r.stdout.split('\n')) {
    const at = line.indexOf(' ')
    if (at < 0) continue
    const rest = line.slice(at + 1)
    got[line.slice(0, at)] = rest.startsWith('ERR') ? null : rest
  }
  return got
}

await section('allowInternetAccess false, then updateNetwork', async () => {
  const sbx = await create({ allowInternetAccess: false })
  let got = await fetchIn(sbx, `http://${ALLOWED}/`)
  check('internet off: nothing reached', got[`http://${ALLOWED}/`] === null, show(got))
  check('internet off: getInfo', (await sbx.getInfo()).allowInternetAccess === false)
  await sbx.updateNetwork({})
  got = await fetchIn(sbx, `http://${ALLOWED}/`)
  check('updateNetwork {}: open again', got[`http://${ALLOWED}/`] === `hello from ${ALLOWED}:80`, show(got))
  await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [OTHER] })
  got = await fetchIn(sbx, `http://${ALLOWED}/`, `http://${OTHER}/`)
  check('updateNetwork deny-all + allow: the exception', got[`http://${OTHER}/`] !== null, show(got))
  check('updateNetwork deny-all + allow: the rest', got[`http://${ALLOWED}/`] === null, show(got))
  const info = await sbx.getInfo()
  check('getInfo shows the update', show(info.network?.allowOut) === show([OTHER]), show(info.network))
})

await section('domains', async () => {
  const sbx = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['allowed.test'] } })
  const got = await fetchIn(sbx, 'http://allowed.test/', 'http://other.test/', `http://${ALLOWED}/`)
  check('domain: allowed name', got['http://allowed.test/'] === `hello from ${ALLOWED}:80`, show(got))
  check('domain: other name', got['http://other.test/'] === null, show(got))
  check('domain: its IP literal', got[`http://${ALLOWED}/`] === null, show(got))
  const refused = await rejection(create({ network: { allowOut: ['allowed.test'] } }))
  check('domain without ALL_TRAFFIC refused', refused !== null && /ALL_TRAFFIC/.test(refused.message), String(refused))
})

await section('allow beats deny', async () => {
  const sbx = await create({ network: { denyOut: ['203.0.113.0/24'], allowOut: [ALLOWED] } })
  const got = await fetchIn(sbx, `http://${ALLOWED}/`, `http://${OTHER}/`)
  check('allow beats deny: the allowed address', got[`http://${ALLOWED}/`] !== null, show(got))
  check('allow beats deny: the rest of the range', got[`http://${OTHER}/`] === null, show(got))
})

await section('private traffic', async () => {
  const sbx = await create({ network: { allowPublicTraffic: false } })
  check('private traffic: a token', typeof sbx.trafficAccessToken === 'string' && sbx.trafficAccessToken.length > 0)
  await sbx.commands.run('python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  const url = process.env.E2B_SANDBOX_URL + '/'
  const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }
  let status = 0
  for (let i = 0; i < 100; i++) {
    const r = await fetch(url, { headers: { ...headers, 'e2b-traffic-access-token': sbx.trafficAccessToken } })
    status = r.status
    if (status === 200) break
    await new Promise((res) => setTimeout(res, 50))
  }
  check('private traffic: with the token, 200', status === 200, String(status))
  const without = await fetch(url, { headers })
  check('private traffic: without it, 403', without.status === 403, String(without.status))
})

await section('secrets and a header transform', async () => {
  const value = 'js-s3cret-value-7'
  const made1 = await Secret.create('jstok', value)
  check('Secret.create', made1.name === 'jstok' && made1.secretId.startsWith('sec_'), show(made1))
  check('Secret.getInfo has no value', !JSON.stringify(await Secret.getInfo('jstok')).includes(value))
  const sbx = await create({
    network: {
      rules: { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill('jstok')}` } } }] },
    },
  })
  const got = await fetchIn(sbx, 'https://allowed.test:8443/')
  const body = got['https://allowed.test:8443/'] ?? ''
  const want = createHash('sha256').update(`Bearer ${value}`).digest('hex')
  check('transform: the host got the secret', body.includes(`auth-sha256: ${want}`), body)
  check('transform: the sandbox did not', !body.includes(value), body)
  check('Secret.destroy', (await Secret.destroy('jstok')) === true)
})

for (const s of made) await s.kill().catch(() => {})
finish()
