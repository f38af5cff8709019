// The official JS client (npm `e2b`, from tests/support/install-python-deps.sh's
// node_modules) against `brig serve --e2b`: the lifecycle, commands and files.
// Run by crates/server/tests/e2b_control.rs with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL pointing at brig; prints one line per check and
// "N passed, 0 failed" at the end, exits non-zero on the first failure.
import { Sandbox, CommandExitError } from 'e2b'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const version = require('e2b/package.json').version
console.log(`e2b ${version} (js)`)

let passed = 0
function check(name, ok, detail = '') {
  if (!ok) {
    console.log(`FAIL ${name} ${detail}`)
    process.exit(1)
  }
  passed += 1
  console.log(`ok ${name}`)
}

const template = process.env.E2B_TEMPLATE || 'base'
const sbx = await Sandbox.create(template, { envs: { GREETING: 'hi' }, metadata: { suite: 'js' }, timeoutMs: 60_000 })
check('create', typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0)

const r = await sbx.commands.run('echo $GREETING; echo err >&2')
check('commands.run stdout and create-time env', r.stdout === 'hi\n', JSON.stringify(r))
check('commands.run stderr', r.stderr === 'err\n', JSON.stringify(r))
check('exit code 0', r.exitCode === 0)

let failed = null
try {
  await sbx.commands.run('exit 3')
} catch (e) {
  failed = e
}
check('non-zero exit is CommandExitError', failed instanceof CommandExitError && failed.exitCode === 3, String(failed))

await sbx.files.write('/tmp/js.txt', 'from js')
check('files.write + read', (await sbx.files.read('/tmp/js.txt')) === 'from js')
const entries = await sbx.files.list('/tmp')
check('files.list', entries.some((e) => e.name === 'js.txt'), JSON.stringify(entries))
check('files.exists', (await sbx.files.exists('/tmp/js.txt')) === true)

const bg = await sbx.commands.run('sleep 30', { background: true })
check('background command has a pid', bg.pid > 0)
check('kill a background command', (await bg.kill()) === true)

const info = await sbx.getInfo()
check('getInfo', info.sandboxId === sbx.sandboxId && info.metadata.suite === 'js', JSON.stringify(info))

const list = await Sandbox.list().nextItems()
check('Sandbox.list sees it', list.some((s) => s.sandboxId === sbx.sandboxId))

check('isRunning', (await sbx.isRunning()) === true)
check('kill', (await sbx.kill()) === true)
check('not running after kill', (await sbx.isRunning()) === false)

console.log(`${passed} passed, 0 failed`)
