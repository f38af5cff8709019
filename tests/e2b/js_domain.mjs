// The official E2B JS SDK with only E2B_DOMAIN set, over HTTPS (driven by
// crates/cli/tests/serve_e2b.rs against `brig serve --e2b --e2b-domain`).
// Node trusts brig's local CA through NODE_EXTRA_CA_CERTS. Covers: create
// (the sandbox's domain is the daemon's), commands, files, a port of the
// sandbox through getHost(port) over HTTPS with Node's fetch, kill.
// Prints one line per check and `N passed, 0 failed` at the end.
import { Sandbox } from 'e2b'

let passed = 0
function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${JSON.stringify(detail)}`)
  passed += 1
  console.log(`ok ${name}`)
}

const domain = process.env.E2B_DOMAIN
check('only E2B_DOMAIN points at brig', !process.env.E2B_API_URL && !process.env.E2B_SANDBOX_URL)
const sbx = await Sandbox.create(process.env.E2B_TEMPLATE || 'base', { timeoutMs: 120_000 })
console.log(`sandbox ${sbx.sandboxId}`)
try {
  check("the sandbox's domain is the daemon's", sbx.sandboxDomain === domain, sbx.sandboxDomain)
  const r = await sbx.commands.run('echo hi-js')
  check('a command over https', r.stdout === 'hi-js\n', r)
  await sbx.files.write('/tmp/js.txt', 'js over tls')
  check('files.read', (await sbx.files.read('/tmp/js.txt')) === 'js over tls')
  await sbx.commands.run('mkdir -p /tmp/www && echo hello-js-8000 > /tmp/www/index.html')
  const server = await sbx.commands.run(
    'cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1',
    { background: true },
  )
  const host = sbx.getHost(8000)
  check('getHost names the port under the domain', host === `8000-${sbx.sandboxId}.${domain}`, host)
  let body
  for (let i = 0; i < 100 && body === undefined; i++) {
    try {
      const resp = await fetch(`https://${host}/index.html`)
      if (resp.status === 200) body = await resp.text()
    } catch (e) {
      if (i === 99) console.log(`fetch: ${e.cause ?? e}`)
    }
    if (body === undefined) await new Promise((r) => setTimeout(r, 100))
  }
  check("the sandbox's port over https", body === 'hello-js-8000\n', body)
  await server.kill()
} finally {
  await sbx.kill()
}
check('killed', !(await Sandbox.kill(sbx.sandboxId)))
console.log(`${passed} passed, 0 failed`)
