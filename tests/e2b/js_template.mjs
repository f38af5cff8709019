// E2B's template builder through the official JS client (npm `e2b`) against
// brig: a template from E2B's base image (brig's `base`) with a copied file
// and directory, runCmd, setEnvs, setUser, setWorkdir and a start command
// with a ready check, then a sandbox from it; a rebuild from the cache; a
// failing step. Run by crates/e2b/tests/e2b_js.rs (`js_sdk_template_build`)
// with E2B_TEMPLATE_PREFIX naming this run's templates. Prints "ok NAME"
// per check and "N passed, M failed".
import { Sandbox, Template, waitForFile } from 'e2b'
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { check, finish, rejection, section, show } from './sdk_checks.mjs'

const PREFIX = process.env.E2B_TEMPLATE_PREFIX ?? 'brigtestjs'
const NAME = `${PREFIX}-js`
const ctx = mkdtempSync(join(tmpdir(), 'brig-e2b-js-ctx-'))
writeFileSync(join(ctx, 'note.txt'), 'from js\n')
mkdirSync(join(ctx, 'lib', 'deep'), { recursive: true })
writeFileSync(join(ctx, 'lib', 'deep', 'x.txt'), 'deep\n')
process.on('exit', () => rmSync(ctx, { recursive: true, force: true }))
const nonce = `${Date.now()}-${process.pid}`

const template = () =>
  Template({ fileContextPath: ctx })
    .fromBaseImage()
    .copy('note.txt', '/home/user/note.txt')
    .copy('lib', '/opt/lib/')
    .runCmd(`echo ${nonce} > /opt/nonce && echo js-build-output`)
    .setEnvs({ JS_VAR: 'set by js' })
    .setUser('user')
    .setWorkdir('/home/user')
    .setStartCmd('echo up > /tmp/up; sleep 1000', waitForFile('/tmp/up'))

await section('build, then a sandbox from it', async () => {
  const logs = []
  const info = await Template.build(template(), NAME, {
    skipCache: true,
    onBuildLogs: (e) => logs.push(String(e.message)),
  })
  check('build: the template id', info.templateId === NAME, show(info))
  check('build: a RUN\'s output in the logs', logs.some((m) => m.includes('js-build-output')), show(logs))
  check('exists', await Template.exists(NAME))
  const sbx = await Sandbox.create(NAME)
  try {
    const run = async (cmd) => (await sbx.commands.run(cmd)).stdout
    check('the copied file', (await run('cat /home/user/note.txt')) === 'from js\n')
    check('the copied directory', (await run('cat /opt/lib/deep/x.txt')) === 'deep\n')
    check('the RUN step', (await run('cat /opt/nonce')) === `${nonce}\n`)
    check('the env', (await run('echo $JS_VAR')) === 'set by js\n')
    check('the user and workdir', (await run('id -un; pwd')) === 'user\n/home/user\n')
    check('the start command ran', (await run('cat /tmp/up')) === 'up\n')
  } finally {
    await sbx.kill()
  }
  const again = []
  await Template.build(template(), NAME, { onBuildLogs: (e) => again.push(String(e.message)) })
  const cached = again.filter((m) => m.trim() === '(cached)').length
  check('rebuild: every layer from the cache', cached === 3, show(again))
})

await section('a failing step', async () => {
  const failing = Template().fromTemplate(NAME).runCmd('echo js-failing; exit 7')
  const e = await rejection(Template.build(failing, `${PREFIX}-js-failing`))
  check('failing: a BuildError', e?.name === 'BuildError', `${e?.name}: ${e?.message}`)
  check('failing: the exit code and output', /exited with 7/.test(e?.message) && /js-failing/.test(e?.message), e?.message)
  check('failing: nothing registered', !(await Template.exists(`${PREFIX}-js-failing`)))
})

finish()
