// The official JS client (npm `e2b`, from tests/support/install-node-deps.sh's
// node_modules) against `brig serve --e2b`: the lifecycle, commands, PTY and
// files. Run by crates/e2b/tests/e2b_js.rs with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL pointing at brig and E2B_TEMPLATE naming a template whose
// default user is `user` with passwordless sudo (`base`).
//
// Prints "ok NAME" or "FAIL NAME ..." per check, then "N passed, M failed";
// exits non-zero if anything failed. A section that throws counts as one
// failure and the next section runs. Every sandbox it made is killed at the end.
import {
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  NotFoundError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b'
import { createRequire } from 'node:module'
import { check, finish, rejection, section, show } from './sdk_checks.mjs'
import { randomBytes } from 'node:crypto'

const require = createRequire(import.meta.url)
const version = require('e2b/package.json').version
console.log(`e2b ${version} (js)`)


// Resolves once cond() is truthy; false after `ms`.
async function waitFor(cond, ms = 10_000) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (await cond()) return true
    await new Promise((r) => setTimeout(r, 50))
  }
  return false
}


const template = process.env.E2B_TEMPLATE || 'base'
// brig's isolation tier for every sandbox the suite makes (the metadata key
// `brig.isolation`); the daemon's default when unset.
const isolation = process.env.BRIG_ISOLATION
const tier = isolation ? { 'brig.isolation': isolation } : {}
const run = randomBytes(6).toString('hex')
const made = []
async function create(opts = {}) {
  const s = await Sandbox.create(template, { timeoutMs: 120_000, ...opts, metadata: { ...tier, ...opts.metadata } })
  made.push(s.sandboxId)
  return s
}

const sbx = await create({ envs: { GREETING: 'hi' }, metadata: { suite: 'js', run } })
check('create', typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0)
if (isolation === 'gvisor') {
  const kernel = (await sbx.commands.run('dmesg | head -1', { user: 'root' })).stdout
  check('it runs under gVisor\'s kernel', kernel.includes('gVisor'), kernel)
}
if (isolation === 'vm') {
  const kernel = (await sbx.commands.run('uname -r')).stdout
  check('it runs in a guest, on the guest\'s own kernel', kernel.trim().endsWith('-cloud-amd64'), kernel)
}

await section('api errors', async () => {
  const unknown = await rejection(Sandbox.create('no-such-template', { timeoutMs: 10_000 }))
  check('an unknown template is refused', unknown instanceof SandboxError && /400/.test(unknown.message), String(unknown))
  const badKey = await rejection(Sandbox.list({ apiKey: 'brig_0000_not-a-key' }).nextItems())
  check('a wrong API key is AuthenticationError', badKey instanceof AuthenticationError, String(badKey))
})

// ---------------------------------------------------------------- commands
await section('commands', async () => {
  const r = await sbx.commands.run('echo $GREETING; echo err >&2')
  check('commands.run stdout and create-time env', r.stdout === 'hi\n', JSON.stringify(r))
  check('commands.run stderr', r.stderr === 'err\n', JSON.stringify(r))
  check('exit code 0', r.exitCode === 0)

  const e = await rejection(sbx.commands.run('echo out; echo bad >&2; exit 3'))
  check(
    'non-zero exit is CommandExitError with exitCode and output',
    e instanceof CommandExitError && e.exitCode === 3 && e.stdout === 'out\n' && e.stderr === 'bad\n' && e.error === 'exit status 3',
    String(e),
  )

  const envs = await sbx.commands.run('echo $FOO $GREETING', { envs: { FOO: 'bar' } })
  const after = await sbx.commands.run('echo ${FOO:-unset}')
  check('per-command envs, not leaking to the next command', envs.stdout === 'bar hi\n' && after.stdout === 'unset\n', JSON.stringify([envs, after]))
  const over = await sbx.commands.run('echo $GREETING', { envs: { GREETING: 'override' } })
  check('per-command envs override create-time ones', over.stdout === 'override\n', JSON.stringify(over))

  const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
  const home = await sbx.commands.run('pwd')
  check('cwd, and the home by default', cwd.stdout === '/tmp\n' && home.stdout === '/home/user\n', JSON.stringify([cwd, home]))
  const badCwd = await rejection(sbx.commands.run('pwd', { cwd: '/no/such/dir' }))
  check('a missing cwd is an error', badCwd !== null && /does not exist/.test(badCwd.message), String(badCwd))

  const who = await sbx.commands.run('echo $(id -un) $USER $HOME')
  check('default user is user with USER and HOME', who.stdout === 'user user /home/user\n', JSON.stringify(who))
  const root = await sbx.commands.run('echo $(id -un) $USER $HOME', { user: 'root' })
  check("user: 'root'", root.stdout === 'root root /root\n', JSON.stringify(root))
  if (isolation === 'gvisor') {
    // gVisor's kernel sets no_new_privs on every task, so setuid programs
    // cannot raise privileges there (docs/e2b.md); `user: 'root'` works.
    const sudo = await rejection(sbx.commands.run('sudo -n id -un'))
    check('sudo is refused under gVisor, saying why', sudo instanceof CommandExitError && /no new privileges/.test(sudo.stderr), String(sudo))
  } else {
    const sudo = await sbx.commands.run('sudo -n id -un')
    check('user has passwordless sudo', sudo.stdout === 'root\n', JSON.stringify(sudo))
  }

  const many = await Promise.all(Array.from({ length: 20 }, (_, i) => sbx.commands.run(`echo ${i}`)))
  check('20 commands at once', many.every((r, i) => r.stdout === `${i}\n`), JSON.stringify(many.map((r) => r.stdout)))

  // Streaming callbacks and multi-MB output, in order.
  let streamed = ''
  let calls = 0
  const big = await sbx.commands.run('seq 1 400000', {
    onStdout: (d) => {
      streamed += d
      calls += 1
    },
  })
  const want = Array.from({ length: 400000 }, (_, i) => `${i + 1}\n`).join('')
  check('long output (2.7 MB) complete and in order', big.stdout.length === want.length && big.stdout === want, `${big.stdout.length} vs ${want.length}`)
  check('onStdout streams it in chunks', streamed === want && calls > 1, `${calls} calls, ${streamed.length} bytes`)
  const errs = []
  await sbx.commands.run('for i in 1 2 3; do echo e$i >&2; sleep 0.1; done', { onStderr: (d) => errs.push(d) })
  check('onStderr', errs.join('') === 'e1\ne2\ne3\n' && errs.length >= 2, JSON.stringify(errs))

  // Background + stdin + list.
  const got = []
  const cat = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => got.push(d) })
  check('background command has a pid', cat.pid > 0)
  await cat.sendStdin('hello\n')
  check('handle.sendStdin reaches the process', await waitFor(() => got.join('') === 'hello\n'), JSON.stringify(got))
  await sbx.commands.sendStdin(cat.pid, 'world\n')
  check('commands.sendStdin(pid)', await waitFor(() => got.join('') === 'hello\nworld\n'), JSON.stringify(got))
  const procs = await sbx.commands.list()
  const listed = procs.find((p) => p.pid === cat.pid)
  check(
    'commands.list shows it with its command',
    listed !== undefined && listed.cmd === '/bin/bash' && JSON.stringify(listed.args) === JSON.stringify(['-l', '-c', 'cat']),
    JSON.stringify(procs),
  )
  await cat.closeStdin()
  const catDone = await cat.wait()
  check('closeStdin ends it: exit 0 with all output', catDone.exitCode === 0 && catDone.stdout === 'hello\nworld\n', JSON.stringify(catDone))
  check('commands.list no longer shows it', !(await sbx.commands.list()).some((p) => p.pid === cat.pid))

  // Connect to a running background command from elsewhere.
  const ticker = await sbx.commands.run('for i in 1 2 3 4 5 6; do echo t$i; sleep 0.2; done', { background: true })
  const other = await Sandbox.connect(sbx.sandboxId)
  const attached = await other.commands.connect(ticker.pid)
  const tail = await attached.wait()
  check('commands.connect(pid) gets the rest and the exit', tail.exitCode === 0 && tail.stdout.endsWith('t6\n'), JSON.stringify(tail))

  // Kill.
  const sleeper = await sbx.commands.run('sleep 60', { background: true })
  check('commands.kill', (await sbx.commands.kill(sleeper.pid)) === true)
  const killed = await rejection(sleeper.wait())
  check('killed: CommandExitError exitCode -1, signal: killed', killed instanceof CommandExitError && killed.exitCode === -1 && killed.error === 'signal: killed', String(killed))
  check('killing a gone pid is false', (await sbx.commands.kill(sleeper.pid)) === false)
  const bg = await sbx.commands.run('sleep 60', { background: true })
  check('handle.kill', (await bg.kill()) === true && (await rejection(bg.wait())) instanceof CommandExitError)

  // timeoutMs: the client gives up and the process is killed.
  const t0 = Date.now()
  const to = await rejection(sbx.commands.run('sleep 30; echo late > /tmp/late', { timeoutMs: 1500 }))
  check('timeoutMs rejects with TimeoutError', to instanceof TimeoutError && Date.now() - t0 < 10_000, String(to))
  const gone = await waitFor(async () => !(await sbx.commands.list()).some((p) => JSON.stringify(p.args).includes('/tmp/late')))
  check('the timed-out process is gone', gone)
})

// -------------------------------------------------------------------- PTY
await section('pty', async () => {
  const dec = new TextDecoder()
  let screen = ''
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (screen += dec.decode(d, { stream: true })) })
  check('pty.create has a pid', pty.pid > 0)
  const enc = new TextEncoder()
  await sbx.pty.sendInput(pty.pid, enc.encode('echo $((6*7))-$TERM; tty; stty size\n'))
  check('pty input and output', await waitFor(() => /42-xterm-256color/.test(screen) && /\/dev\/pts\/\d+/.test(screen) && /24 80/.test(screen)), JSON.stringify(screen))
  // Resized once the shell is back at its prompt: readline reads the size
  // and writes it back as it draws one, undoing a resize sent in between.
  await waitFor(() => /24 80\r?\n[\s\S]*[$#] $/.test(screen))
  await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 })
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size\n'))
  check('pty.resize', await waitFor(() => /40 120/.test(screen)), JSON.stringify(screen))
  await sbx.pty.sendInput(pty.pid, enc.encode('whoami; pwd\n'))
  check('pty runs as the default user in its home', await waitFor(() => /user\r?\n\/home\/user/.test(screen)), JSON.stringify(screen))
  // A second client attaches to the same terminal.
  const other = await Sandbox.connect(sbx.sandboxId)
  const dec2 = new TextDecoder()
  let seen2 = ''
  const attached = await other.pty.connect(pty.pid, { onData: (d) => (seen2 += dec2.decode(d, { stream: true })) })
  await sbx.pty.sendInput(pty.pid, enc.encode('echo again-$((1+1))\n'))
  check('pty.connect from another client gets live output', attached.pid === pty.pid && (await waitFor(() => seen2.includes('again-2'))), JSON.stringify(seen2))
  await attached.disconnect()
  check('pty.kill', (await sbx.pty.kill(pty.pid)) === true)
  const end = await rejection(pty.wait())
  check('a killed pty ends with exitCode -1', end instanceof CommandExitError && end.exitCode === -1, String(end))

  // cwd and envs; exit ends it with the status.
  let out2 = ''
  const pty2 = await sbx.pty.create({ cols: 80, rows: 24, cwd: '/tmp', envs: { PTY_VAR: 'pv' }, onData: (d) => (out2 += dec.decode(d, { stream: true })) })
  await sbx.pty.sendInput(pty2.pid, enc.encode('echo "$(pwd):$PTY_VAR"; exit 5\n'))
  const end2 = await rejection(pty2.wait())
  check('pty cwd, envs and exit status', end2 instanceof CommandExitError && end2.exitCode === 5 && out2.includes('/tmp:pv'), `${end2} ${JSON.stringify(out2)}`)
})

// ------------------------------------------------------------------ files
await section('files', async () => {
  const f = sbx.files
  const w = await f.write('/home/user/js.txt', 'from js')
  check('files.write answers the entry', w.path === '/home/user/js.txt' && w.name === 'js.txt' && w.type === 'file', JSON.stringify(w))
  check('files.read text', (await f.read('/home/user/js.txt')) === 'from js')
  await f.write('rel.txt', 'relative')
  check('relative paths are under the home', (await f.read('/home/user/rel.txt')) === 'relative')

  const bytes = Uint8Array.from({ length: 256 * 40 }, (_, i) => i % 256)
  await f.write('/home/user/bin.dat', bytes.buffer)
  const back = await f.read('/home/user/bin.dat', { format: 'bytes' })
  check('bytes round-trip', back instanceof Uint8Array && Buffer.compare(Buffer.from(back), Buffer.from(bytes)) === 0, `${back?.length}`)
  const blob = await f.read('/home/user/bin.dat', { format: 'blob' })
  check('read as blob', blob.size === bytes.length && Buffer.compare(Buffer.from(await blob.arrayBuffer()), Buffer.from(bytes)) === 0)
  const stream = await f.read('/home/user/bin.dat', { format: 'stream' })
  const parts = []
  for await (const c of stream) parts.push(Buffer.from(c))
  check('read as stream', Buffer.compare(Buffer.concat(parts), Buffer.from(bytes)) === 0)
  await f.write('/home/user/blob.txt', new Blob(['blob ', 'data']))
  check('write a Blob', (await f.read('/home/user/blob.txt')) === 'blob data')
  const big = randomBytes(3 << 20)
  const rs = new ReadableStream({
    start(c) {
      for (let i = 0; i < big.length; i += 1 << 18) c.enqueue(big.subarray(i, i + (1 << 18)))
      c.close()
    },
  })
  await f.write('/home/user/stream.bin', rs)
  const bigBack = await f.read('/home/user/stream.bin', { format: 'bytes' })
  check('write a 3 MB ReadableStream (octet-stream upload)', Buffer.compare(Buffer.from(bigBack), big) === 0, `${bigBack.length}`)
  await f.write('/home/user/gz.txt', 'gzipped '.repeat(1000), { gzip: true })
  check('gzip upload and download', (await f.read('/home/user/gz.txt', { gzip: true })) === 'gzipped '.repeat(1000))
  check('empty file', (await f.write('/home/user/empty', '')) && (await f.read('/home/user/empty')) === '')

  const many = await f.write([
    { path: '/home/user/many/a.txt', data: 'A' },
    { path: '/home/user/many/sub/b.txt', data: 'B' },
    { path: '/tmp/c.txt', data: new TextEncoder().encode('C') },
  ])
  check(
    'write many files at once (parents created)',
    Array.isArray(many) && many.length === 3 && (await f.read('/home/user/many/sub/b.txt')) === 'B' && (await f.read('/tmp/c.txt')) === 'C',
    JSON.stringify(many),
  )

  const missing = await rejection(f.read('/home/user/nope.txt'))
  check('reading a missing file is FileNotFoundError', missing instanceof FileNotFoundError || missing instanceof NotFoundError, String(missing))

  // list with depth.
  await f.makeDir('/home/user/tree/a/b/c')
  await f.write('/home/user/tree/top.txt', 't')
  await f.write('/home/user/tree/a/b/deep.txt', 'd')
  const d1 = (await f.list('/home/user/tree')).map((e) => `${e.type}:${e.path}`).sort()
  check('list depth 1', JSON.stringify(d1) === JSON.stringify(['dir:/home/user/tree/a', 'file:/home/user/tree/top.txt']), JSON.stringify(d1))
  const d2 = (await f.list('/home/user/tree', { depth: 2 })).map((e) => `${e.type}:${e.path}`).sort()
  check(
    'list depth 2',
    JSON.stringify(d2) === JSON.stringify(['dir:/home/user/tree/a', 'dir:/home/user/tree/a/b', 'file:/home/user/tree/top.txt']),
    JSON.stringify(d2),
  )
  const d3 = (await f.list('/home/user/tree', { depth: 3 })).map((e) => e.path)
  check('list depth 3', d3.includes('/home/user/tree/a/b/c') && d3.includes('/home/user/tree/a/b/deep.txt') && d3.length === 5, JSON.stringify(d3))

  check('exists: file, dir, missing', (await f.exists('/home/user/js.txt')) && (await f.exists('/home/user/tree')) && !(await f.exists('/home/user/nope')))

  const info = await f.getInfo('/home/user/js.txt')
  check(
    'getInfo of a file',
    info.name === 'js.txt' && info.type === 'file' && info.path === '/home/user/js.txt' && info.size === 7 && info.permissions === '-rw-r--r--' && (info.mode & 0o777) === 0o644 && info.modifiedTime instanceof Date && Math.abs(info.modifiedTime - Date.now()) < 120_000,
    JSON.stringify(info),
  )
  check('getInfo owner and group are the writing user', info.owner === 'user' && info.group === 'user', JSON.stringify(info))
  const dinfo = await f.getInfo('/home/user/tree')
  check('getInfo of a dir', dinfo.type === 'dir' && dinfo.permissions.startsWith('d'), JSON.stringify(dinfo))
  await sbx.commands.run('ln -s /home/user/js.txt /home/user/link')
  const linfo = await f.getInfo('/home/user/link')
  check('getInfo of a symlink', linfo.type === 'symlink' && linfo.symlinkTarget === '/home/user/js.txt', JSON.stringify(linfo))
  check('getInfo of a missing path is NotFoundError', (await rejection(f.getInfo('/home/user/nope'))) instanceof NotFoundError)

  check('makeDir creates (parents too)', (await f.makeDir('/home/user/made/x/y')) === true && (await f.getInfo('/home/user/made/x/y')).type === 'dir')
  check('makeDir of an existing dir is false', (await f.makeDir('/home/user/made/x')) === false)
  const owned = await sbx.commands.run('stat -c %U /home/user/made/x/y /home/user/js.txt')
  check('made dirs and written files belong to the user', owned.stdout === 'user\nuser\n', JSON.stringify(owned))

  const moved = await f.rename('/home/user/js.txt', '/home/user/moved/js2.txt')
  check(
    'rename answers the new entry',
    moved.path === '/home/user/moved/js2.txt' && !(await f.exists('/home/user/js.txt')) && (await f.read('/home/user/moved/js2.txt')) === 'from js',
    JSON.stringify(moved),
  )
  await f.remove('/home/user/moved/js2.txt')
  await f.remove('/home/user/tree')
  check('remove a file and a tree', !(await f.exists('/home/user/moved/js2.txt')) && !(await f.exists('/home/user/tree')))

  // As another user.
  const rootW = await f.write('/root/r.txt', 'r', { user: 'root' })
  check("write and read as user 'root'", rootW.path === '/root/r.txt' && (await f.read('/root/r.txt', { user: 'root' })) === 'r')
})

// ------------------------------------------------------------------ watch
await section('watch', async () => {
  const f = sbx.files
  await f.makeDir('/home/user/w/sub')
  const events = []
  const h = await f.watchDir('/home/user/w', (e) => events.push(e))
  await f.write('/home/user/w/one.txt', '1')
  await f.write('/home/user/w/sub/nested.txt', 'n')
  await f.rename('/home/user/w/one.txt', '/home/user/w/two.txt')
  await f.remove('/home/user/w/two.txt')
  const seen = () => events.map((e) => `${e.type}:${e.name}`)
  check(
    'watchDir: create, write, rename, remove',
    await waitFor(() => ['create:one.txt', 'write:one.txt', 'rename:one.txt', 'remove:two.txt'].every((x) => seen().includes(x))),
    JSON.stringify(seen()),
  )
  check('non-recursive watch ignores subdirectories', !seen().some((x) => x.includes('nested')), JSON.stringify(seen()))
  await h.stop()
  const n = events.length
  await f.write('/home/user/w/after.txt', 'a')
  await new Promise((r) => setTimeout(r, 500))
  check('no events after stop', events.length === n, JSON.stringify(seen()))

  const rec = []
  const hr = await f.watchDir('/home/user/w', (e) => rec.push(`${e.type}:${e.name}`), { recursive: true })
  await f.write('/home/user/w/sub/deep.txt', 'd')
  check('recursive watch sees sub/deep.txt', await waitFor(() => rec.includes('create:sub/deep.txt')), JSON.stringify(rec))
  await hr.stop()

  const werr = await rejection(f.watchDir('/home/user/not-there', () => {}))
  check('watching a missing dir fails', werr !== null, String(werr))
})

// ------------------------------------------------------- signed file URLs
await section('file urls', async () => {
  const up = await sbx.uploadUrl('/home/user/uploaded.txt')
  const u = new URL(up)
  check('uploadUrl is signed and points at E2B_SANDBOX_URL', u.origin === new URL(process.env.E2B_SANDBOX_URL).origin && u.pathname === '/files' && u.searchParams.get('signature')?.startsWith('v1_'), up)
  const form = new FormData()
  form.append('file', new Blob(['uploaded via url']), 'uploaded.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  check('POST to the upload URL (no routing headers) writes the file', res.ok && (await sbx.files.read('/home/user/uploaded.txt')) === 'uploaded via url', `${res.status} ${await res.text()}`)
  const down = await sbx.downloadUrl('/home/user/uploaded.txt')
  const got = await fetch(down)
  check('GET the download URL', got.status === 200 && (await got.text()) === 'uploaded via url', String(got.status))
  const bad = new URL(down)
  bad.searchParams.set('path', '/home/user/other.txt')
  const forged = await fetch(bad)
  const forgedBody = await forged.text()
  check('a signature for another path finds no sandbox', forged.status === 400 && !forgedBody.includes('uploaded via url'), `${forged.status} ${forgedBody}`)
  const routed = await fetch(bad, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } })
  check('and with routing headers is 401', routed.status === 401, `${routed.status} ${await routed.text()}`)
  const exp = await sbx.downloadUrl('/home/user/uploaded.txt', { useSignatureExpiration: 60 })
  check('download URL with expiration', (await (await fetch(exp)).text()) === 'uploaded via url')
  const expired = await sbx.downloadUrl('/home/user/uploaded.txt', { useSignatureExpiration: -10 })
  const er = await fetch(expired)
  const body = await er.text()
  check('an expired signature is refused', er.status === 401 && body.includes('signature is already expired'), `${er.status} ${body}`)
})

// ---------------------------------------------------------------- control
await section('control', async () => {
  const info = await sbx.getInfo()
  check(
    'getInfo',
    info.sandboxId === sbx.sandboxId && info.templateId === template && info.metadata.suite === 'js' && info.state === 'running' && info.cpuCount > 0 && info.memoryMB > 0 && info.startedAt <= new Date() && info.endAt > info.startedAt,
    JSON.stringify(info),
  )
  await sbx.setTimeout(300_000)
  const later = await sbx.getInfo()
  const left = later.endAt - Date.now()
  check('setTimeout moves endAt', left > 290_000 && left < 310_000, `${left}`)
  await sbx.setTimeout(200_000)
  const shorter = (await sbx.getInfo()).endAt - Date.now()
  check('setTimeout can shorten it', shorter > 190_000 && shorter < 210_000, `${shorter}`)

  const metrics = await sbx.getMetrics()
  const m = metrics[0]
  check(
    'getMetrics',
    metrics.length >= 1 && m.timestamp instanceof Date && !isNaN(m.timestamp) && m.cpuCount > 0 && m.cpuUsedPct >= 0 && m.memUsed > 0 && m.memTotal >= m.memUsed && m.diskUsed >= 0 && m.diskTotal >= 0,
    JSON.stringify(metrics),
  )

  check('isRunning', (await sbx.isRunning()) === true)
  const again = await Sandbox.connect(sbx.sandboxId)
  await sbx.files.write('/tmp/marker', 'same sandbox')
  check('Sandbox.connect(id) reaches the same sandbox', again.sandboxId === sbx.sandboxId && (await again.files.read('/tmp/marker')) === 'same sandbox')
  check('sbx.connect() on a running sandbox', (await sbx.connect()) === sbx && (await sbx.isRunning()))
  const nf = await rejection(Sandbox.connect('000000000000'))
  check('connecting to an unknown id is SandboxNotFoundError', nf instanceof SandboxNotFoundError, String(nf))

  // A second sandbox: list with paging, pause and resume.
  const b = await create({ metadata: { suite: 'js', run, which: 'b' } })
  const pager = Sandbox.list({ query: { metadata: { run } }, limit: 1 })
  const page1 = await pager.nextItems()
  const more = pager.hasNext
  const page2 = await pager.nextItems()
  const ids = [...page1, ...page2].map((s) => s.sandboxId).sort()
  check('Sandbox.list pages of 1 (X-Next-Token)', page1.length === 1 && more && page2.length === 1 && !pager.hasNext && JSON.stringify(ids) === JSON.stringify([sbx.sandboxId, b.sandboxId].sort()), JSON.stringify({ page1, page2 }))
  const onlyB = await Sandbox.list({ query: { metadata: { run, which: 'b' } } }).nextItems()
  check('Sandbox.list metadata filter', onlyB.length === 1 && onlyB[0].sandboxId === b.sandboxId && onlyB[0].state === 'running', JSON.stringify(onlyB))

  await b.files.write('/tmp/keep', 'kept')
  const proc = await b.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  check('pause', (await b.pause()) === true)
  check('pausing again (betaPause) is false', (await b.betaPause()) === false)
  check('getInfo says paused', (await b.getInfo()).state === 'paused')
  const paused = await Sandbox.list({ query: { metadata: { run }, state: ['paused'] } }).nextItems()
  check('Sandbox.list state=paused', paused.length === 1 && paused[0].sandboxId === b.sandboxId && paused[0].state === 'paused', JSON.stringify(paused))
  const resumed = await Sandbox.connect(b.sandboxId)
  check('Sandbox.connect resumes it', (await resumed.getInfo()).state === 'running' && (await resumed.isRunning()))
  check('files and processes survive pause/resume', (await resumed.files.read('/tmp/keep')) === 'kept' && (await resumed.commands.list()).some((p) => p.pid === proc.pid))
  check('pause again, then sbx.connect() resumes', (await b.pause()) === true && (await b.connect()) === b && (await b.getInfo()).state === 'running')

  // A timeout that runs out kills the sandbox.
  const c = await create({ metadata: { suite: 'js', which: 'c' } })
  await c.setTimeout(1_000)
  check('a sandbox whose timeout ran out is gone', await waitFor(async () => !(await c.isRunning()), 15_000))
  check('killing it then is false', (await Sandbox.kill(c.sandboxId)) === false)

  check('Sandbox.kill(id)', (await Sandbox.kill(b.sandboxId)) === true && (await b.isRunning()) === false)

  // Killed while a command streams: the client's killed-sandbox error
  // (TimeoutError, as on E2B), not a CommandExitError with exit code -1.
  const d = await create({ metadata: { suite: 'js', which: 'd' } })
  const killer = setTimeout(() => Sandbox.kill(d.sandboxId).catch(() => {}), 1_500)
  const cut = await rejection(d.commands.run('sleep 30'))
  clearTimeout(killer)
  check('killed mid-command: TimeoutError', cut instanceof TimeoutError, String(cut))
})

await section('snapshots and fork', async () => {
  const p = await create({ metadata: { suite: 'js', which: 'snap' } })
  await p.commands.run('echo one > ~/a.txt')
  const snap = await p.createSnapshot({ name: 'js-env' })
  check('createSnapshot: an id and its name', snap.snapshotId.startsWith('snap-') && snap.names.includes('js-env'), JSON.stringify(snap))
  await p.commands.run('echo two > ~/a.txt')
  const listed = await Sandbox.listSnapshots({ sandboxId: p.sandboxId }).nextItems()
  check('listSnapshots(sandboxId)', listed.length === 1 && listed[0].snapshotId === snap.snapshotId, JSON.stringify(listed))
  const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
  made.push(child.sandboxId)
  check('Sandbox.create(snapshotId): its files', (await child.files.read('/home/user/a.txt')) === 'one\n')
  const forks = await p.fork({ count: 2 })
  for (const f of forks) if (f instanceof Sandbox) made.push(f.sandboxId)
  const failedForks = forks.filter((f) => !(f instanceof Sandbox)).map(String)
  check('fork({count: 2}): two sandboxes', forks.length === 2 && failedForks.length === 0, show(failedForks))
  check('fork({count: 2}): with the files of now', failedForks.length === 0 && (await Promise.all(forks.map((f) => f.files.read('/home/user/a.txt')))).every((t) => t === 'two\n'))
  await forks[0].files.write('/home/user/a.txt', 'mine')
  check('a fork is its own', (await forks[1].files.read('/home/user/a.txt')) === 'two\n' && (await p.files.read('/home/user/a.txt')) === 'two\n')
  check('deleteSnapshot: true, then false', (await Sandbox.deleteSnapshot(snap.snapshotId)) === true && (await Sandbox.deleteSnapshot(snap.snapshotId)) === false)
})

check('kill', (await sbx.kill()) === true)
check('not running after kill', (await sbx.isRunning()) === false)
check('Sandbox.list no longer has them', !(await Sandbox.list({ query: { metadata: { run } } }).nextItems()).length)

// Whatever a failed section left behind.
for (const id of made) await Sandbox.kill(id).catch(() => {})

finish()
