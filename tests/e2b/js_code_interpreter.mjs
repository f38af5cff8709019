// The official JS code-interpreter client (npm `@e2b/code-interpreter`, from
// tests/support/install-node-deps.sh's node_modules) against `brig serve --e2b`
// on the `code-interpreter-v1` template: runCode and contexts. Run by
// crates/e2b/tests/e2b_js.rs with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL pointing at brig.
//
// Prints "ok NAME" or "FAIL NAME ..." per check, then "N passed, M failed";
// exits non-zero if anything failed. A section that throws counts as one
// failure and the next section runs. The sandbox is killed at the end.
import { Sandbox, NotFoundError, SandboxError, TimeoutError } from '@e2b/code-interpreter'
import { createRequire } from 'node:module'
import { check, finish, rejection, section, show } from './sdk_checks.mjs'

const require = createRequire(import.meta.url)
const ciVersion = require('@e2b/code-interpreter/package.json').version
const version = require('e2b/package.json').version
console.log(`@e2b/code-interpreter ${ciVersion} (e2b ${version}, js)`)




const template = process.env.E2B_TEMPLATE || 'code-interpreter-v1'
// brig's isolation tier (the metadata key `brig.isolation`); the daemon's
// default when unset.
const isolation = process.env.BRIG_ISOLATION
const metadata = isolation ? { 'brig.isolation': isolation } : {}
const sbx = await Sandbox.create(template, { envs: { CI_VAR: 'from-create' }, timeoutMs: 300_000, metadata })
check('create', sbx.sandboxId.length > 0)

await section('basics', async () => {
  const first = await sbx.runCode('x = 1\nx')
  check('runCode right after create', first.text === '1' && first.error === undefined, show(first))
  const again = await sbx.runCode('x += 1; x')
  check('state across calls', again.text === '2', show(again))
  check('executionCount counts up', Number.isInteger(first.executionCount) && again.executionCount === first.executionCount + 1, `${first.executionCount} ${again.executionCount}`)
  const s = await sbx.runCode("'abc'")
  check('text drops the quotes of a string repr', s.text === 'abc', show(s))
  const logs = await sbx.runCode("import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')")
  check(
    'stdout and stderr logs',
    logs.logs.stdout.join('') === 'out 1\nout 2\n' && logs.logs.stderr.join('') === 'err 1\n' && logs.results.length === 0,
    show(logs),
  )
  const none = await sbx.runCode('y = 5')
  check('no result for a statement', none.results.length === 0 && none.text === undefined, show(none))

  const err = await sbx.runCode('1 / 0')
  check(
    'an error is in execution.error, not thrown',
    err.error?.name === 'ZeroDivisionError' && err.error.value === 'division by zero' && err.error.traceback.includes('ZeroDivisionError'),
    show(err),
  )
  const partial = await sbx.runCode("print('before')\nraise ValueError('boom')")
  check('output before the error is kept', partial.logs.stdout.join('') === 'before\n' && partial.error?.name === 'ValueError' && partial.error.value === 'boom', show(partial))
  const syntax = await sbx.runCode('def (:')
  check('syntax error', syntax.error?.name === 'SyntaxError', show(syntax))
  await sbx.runCode("open('/home/user/from_kernel.txt', 'w').write('k')")
  const who = await sbx.commands.run('id -un; stat -c %U /home/user/from_kernel.txt')
  check('the kernel runs as user, and envd sees its files', (await sbx.files.read('/home/user/from_kernel.txt')) === 'k' && who.stdout === 'user\nuser\n', show(who))
  const still = await sbx.runCode('x')
  check('state survives errors', still.text === '2', show(still))
})

await section('rich results', async () => {
  const plot = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('brig')\nplt.show()",
  )
  const png = plot.results.find((r) => r.png)
  const bytes = png ? Buffer.from(png.png, 'base64') : Buffer.alloc(0)
  check(
    'matplotlib: a PNG display_data result',
    png !== undefined && !png.isMainResult && bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) && bytes.length > 1000,
    show(plot.results.map((r) => r.formats())),
  )
  check('the PNG result has a text repr too', typeof png?.text === 'string' && png.text.includes('Figure'), png?.text)

  const disp = await sbx.runCode(
    "from IPython.display import display, HTML, Markdown\ndisplay(HTML('<b>bold</b>'))\ndisplay(Markdown('# title'))\n42",
  )
  const html = disp.results.find((r) => r.html)
  const md = disp.results.find((r) => r.markdown)
  const main = disp.results.find((r) => r.isMainResult)
  check(
    'display_data results in order, then the main result',
    disp.results.length === 3 && disp.results[0] === html && disp.results[1] === md && disp.results[2] === main && html.html === '<b>bold</b>' && !html.isMainResult && md.markdown === '# title' && main.text === '42' && disp.text === '42',
    show(disp.results),
  )

  const rich = await sbx.runCode(`
class Rich:
    def _repr_html_(self): return '<i>h</i>'
    def _repr_markdown_(self): return '**m**'
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
    def _repr_latex_(self): return r'$x^2$'
    def _repr_json_(self): return {'k': [1, 2]}
    def _repr_javascript_(self): return 'console.log(1)'
    def __repr__(self): return 'Rich()'
Rich()`)
  const r = rich.results[0]
  check(
    'rich formats of one result',
    rich.results.length === 1 && r.isMainResult && r.text === 'Rich()' && r.html === '<i>h</i>' && r.markdown === '**m**' && r.svg.startsWith('<svg') && r.latex === '$x^2$' && show(r.json) === show({ k: [1, 2] }) && r.javascript === 'console.log(1)',
    show(r),
  )
  const formats = r.formats()
  check('formats()', ['html', 'markdown', 'svg', 'latex', 'json', 'javascript'].every((f) => formats.includes(f)), show(formats))
  const extra = await sbx.runCode("from IPython.display import display\ndisplay({'application/x-brig': 'custom', 'text/plain': 'c'}, raw=True)")
  // As upstream's server: other MIME types are sent nested under `extra`,
  // which this client keeps in `raw` (its own `extra` is for top-level keys).
  check('other MIME types arrive under extra', extra.results[0]?.raw?.extra?.['application/x-brig'] === 'custom' && extra.results[0].text === 'c', show(extra.results.map((r) => r.raw)))
})

await section('streaming callbacks', async () => {
  const t0 = Date.now()
  const events = []
  const exec = await sbx.runCode(
    "import sys, time\nfor i in range(3):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.4)\nprint('warn', file=sys.stderr)\nfrom IPython.display import display, HTML\ndisplay(HTML('<p>d</p>'))\n7",
    {
      onStdout: (m) => events.push(['stdout', m.line, Date.now() - t0, m.error]),
      onStderr: (m) => events.push(['stderr', m.line, Date.now() - t0, m.error]),
      onResult: (res) => events.push(['result', res.html ?? res.text, Date.now() - t0]),
    },
  )
  const total = Date.now() - t0
  const outs = events.filter((e) => e[0] === 'stdout')
  check('onStdout per line', outs.map((e) => e[1]).join('') === 'tick 0\ntick 1\ntick 2\n' && outs.every((e) => e[3] === false), show(events))
  check('onStdout is live, not at the end', outs.length === 3 && outs[0][2] < total - 600, `${show(events)} total ${total}`)
  check('onStderr', events.some((e) => e[0] === 'stderr' && e[1] === 'warn\n' && e[3] === true), show(events))
  const results = events.filter((e) => e[0] === 'result').map((e) => e[1])
  check('onResult for display_data and the main result', show(results) === show(['<p>d</p>', '7']) && exec.text === '7', show(events))
  const errs = []
  const failedRun = await sbx.runCode("raise KeyError('k')", { onError: (e) => errs.push(e) })
  check('onError', errs.length === 1 && errs[0].name === 'KeyError' && failedRun.error === errs[0], show(errs))
})

await section('contexts', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
  check('createCodeContext', typeof ctx.id === 'string' && ctx.id.length > 0 && ctx.language === 'python' && ctx.cwd === '/tmp', show(ctx))
  const cwd = await sbx.runCode('import os; os.getcwd()', { context: ctx })
  check("the context's cwd", cwd.text === '/tmp', show(cwd))
  await sbx.runCode('only_here = 3', { context: ctx })
  const inCtx = await sbx.runCode('only_here', { context: ctx })
  const outside = await sbx.runCode('only_here')
  check('contexts are isolated', inCtx.text === '3' && outside.error?.name === 'NameError', show([inCtx, outside]))
  const home = await sbx.runCode('import os; os.getcwd()')
  check('the default context runs in /home/user', home.text === '/home/user', show(home))
  const list = await sbx.listCodeContexts()
  check('listCodeContexts has it and the default python one', list.some((c) => c.id === ctx.id && c.cwd === '/tmp') && list.some((c) => c.language === 'python' && c.cwd === '/home/user'), show(list))
  await sbx.restartCodeContext(ctx)
  const lost = await sbx.runCode('only_here', { context: ctx })
  const cwdKept = await sbx.runCode('import os; os.getcwd()', { context: ctx })
  check('restartCodeContext: state gone, cwd kept', lost.error?.name === 'NameError' && cwdKept.text === '/tmp', show([lost, cwdKept]))
  await sbx.removeCodeContext(ctx.id)
  const after = await sbx.listCodeContexts()
  check('removeCodeContext', !after.some((c) => c.id === ctx.id), show(after))
  const gone = await rejection(sbx.runCode('1', { context: ctx }))
  check('running in a removed context is NotFoundError', gone instanceof NotFoundError, String(gone))
  const badCwd = await rejection(sbx.createCodeContext({ cwd: '/no/such/dir' }))
  check('a context with a missing cwd is refused', badCwd instanceof SandboxError, String(badCwd))

  const bashCtx = await sbx.createCodeContext({ language: 'bash', cwd: '/tmp' })
  const inBash = await sbx.runCode('pwd; echo $BASH_VERSION | cut -c1', { context: bashCtx })
  check('a bash context', bashCtx.language === 'bash' && inBash.logs.stdout.join('') === '/tmp\n5\n', show(inBash))
  await sbx.removeCodeContext(bashCtx)
})

await section('long cells', async () => {
  // Silent for longer than the server's 5 s keepalive interval.
  const quiet = await sbx.runCode("import time\ntime.sleep(6)\nprint('woke')\n'done'")
  check('a cell silent for 6 s (keepalive lines) completes', quiet.text === 'done' && quiet.logs.stdout.join('') === 'woke\n', show(quiet))
  const [c1, c2] = await Promise.all([sbx.createCodeContext(), sbx.createCodeContext()])
  const t0 = Date.now()
  const both = await Promise.all([c1, c2].map((c) => sbx.runCode("import time\ntime.sleep(2)\n'slept'", { context: c })))
  const took = Date.now() - t0
  check('two contexts run in parallel', both.every((e) => e.text === 'slept') && took < 3500, `${took} ms ${show(both)}`)
  await Promise.all([c1, c2].map((c) => sbx.removeCodeContext(c)))
})

await section('bash', async () => {
  const b1 = await sbx.runCode('N=41; echo $((N + 1))', { language: 'bash' })
  check("language: 'bash'", b1.logs.stdout.join('') === '42\n' && b1.error === undefined, show(b1))
  const b2 = await sbx.runCode('echo "n=$N user=$(id -un) home=$HOME"', { language: 'bash' })
  check('bash keeps state, runs as user', b2.logs.stdout.join('') === 'n=41 user=user home=/home/user\n', show(b2))
  const b3 = await sbx.runCode('ls /definitely-missing', { language: 'bash' })
  check('a failing bash command reports it', b3.logs.stderr.join('').includes('definitely-missing') || b3.error !== undefined, show(b3))
  const r = await rejection(sbx.runCode('1', { language: 'r' }))
  check('a language without a kernel is an error', r instanceof SandboxError, String(r))
})

await section('javascript (Deno kernel)', async () => {
  const j1 = await sbx.runCode('const x = 6 * 7; x', { language: 'js' })
  check("language: 'js'", j1.text === '42' && j1.error === undefined, show(j1))
  const j2 = await sbx.runCode('console.log("sum", x + 1, process.env.HOME); x + 1', { language: 'javascript' })
  check('javascript keeps state, logs, runs as user', j2.text === '43' && j2.logs.stdout.join('') === 'sum 43 /home/user\n', show(j2))
  const j3 = await sbx.runCode('const t: number = 3; t * 2', { language: 'ts' })
  check('typescript on the same kernel', j3.text === '6', show(j3))
  const j4 = await sbx.runCode('await new Promise((r) => setTimeout(r, 10)); [1, 2].map((i) => i * 2)', { language: 'js' })
  check('top-level await, structured result', j4.text === '[ 2, 4 ]', show(j4))
  const j5 = await sbx.runCode("throw new TypeError('boom')", { language: 'js' })
  check('a thrown error', j5.error?.name === 'TypeError' && j5.error?.value === 'boom', show(j5))
  const j6 = await sbx.runCode('process.env.J_VAR + " " + process.env.CI_VAR', { language: 'js', envs: { J_VAR: 'j' } })
  check('envs in javascript', j6.text === '"j from-create"', show(j6))
  const jctx = await sbx.createCodeContext({ language: 'js', cwd: '/tmp' })
  const j7 = await sbx.runCode('Deno.cwd()', { context: jctx })
  check('a javascript context with its cwd', jctx.language === 'javascript' && j7.text === '"/tmp"', show([jctx, j7]))
  await sbx.removeCodeContext(jctx)
})

await section('env vars', async () => {
  const g = await sbx.runCode("import os; os.environ.get('CI_VAR')")
  check('create-time env vars reach the kernel', g.text === 'from-create', show(g))
  const e = await sbx.runCode("import os, subprocess\nprint(os.environ['PER_RUN'], subprocess.run(['sh', '-c', 'echo $PER_RUN'], capture_output=True, text=True).stdout, end='')", {
    envs: { PER_RUN: "it's \"quoted\"" },
  })
  check('per-call envs, also for subprocesses', e.logs.stdout.join('') === 'it\'s "quoted" it\'s "quoted"\n', show(e))
  const after = await sbx.runCode("import os; repr(os.environ.get('PER_RUN'))")
  check('per-call envs are gone afterwards', after.text === 'None', show(after))
  const over = await sbx.runCode("import os; os.environ['CI_VAR']", { envs: { CI_VAR: 'override' } })
  const restored = await sbx.runCode("import os; os.environ['CI_VAR']")
  check('an override is restored', over.text === 'override' && restored.text === 'from-create', show([over, restored]))
  const be = await sbx.runCode('echo "$B_VAR $CI_VAR"', { language: 'bash', envs: { B_VAR: 'b' } })
  check('envs in bash', be.logs.stdout.join('') === 'b from-create\n', show(be))
})

await section('timeout', async () => {
  await sbx.runCode('kept = 11')
  const t0 = Date.now()
  const to = await rejection(sbx.runCode('import time; time.sleep(30)', { timeoutMs: 1500 }))
  const took = Date.now() - t0
  check('timeoutMs rejects with TimeoutError, at the timeout', to instanceof TimeoutError && took >= 1400 && took < 4_000, `${String(to)} after ${took} ms`)
  const t1 = Date.now()
  const next = await sbx.runCode('kept')
  check('the kernel was interrupted: the next run is quick and keeps state', next.text === '11' && Date.now() - t1 < 10_000, `${show(next)} ${Date.now() - t1} ms`)
})

check('kill', (await sbx.kill()) === true)
check('not running after kill', (await sbx.isRunning()) === false)
await Sandbox.kill(sbx.sandboxId).catch(() => {})

finish()
