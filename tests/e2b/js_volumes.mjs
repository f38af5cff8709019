// Volumes through the official JS client (`e2b`): Volume.create, list,
// getInfo, connect, destroy; the content API without a sandbox (writeFile,
// readFile, makeDir, list, getInfo, exists, updateMetadata, remove); and
// Sandbox.create({volumeMounts}) with the mounts in getInfo. Run by
// crates/e2b/tests/e2b_volumes.rs (`js_sdk_volumes`) with E2B_API_KEY,
// E2B_API_URL, E2B_VOLUME_API_URL (= E2B_API_URL), E2B_SANDBOX_URL and
// E2B_TEMPLATE set. Prints `N passed, M failed`.
import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { check, section, rejection, show, finish } from './sdk_checks.mjs'

const template = process.env.E2B_TEMPLATE ?? 'base'
const made = []

await section('volumes', async () => {
  const vol = await Volume.create('js-data')
  check('create: an id', vol.volumeId.startsWith('vol-'), vol.volumeId)
  check('create: a token', Boolean(vol.token))
  const taken = await rejection(Volume.create('js-data'))
  check('create: a taken name is refused', taken !== null && /exists/.test(taken.message), taken?.message)
  const all = await Volume.list()
  check('list', all.some((v) => v.volumeId === vol.volumeId && v.name === 'js-data'), show(all))
  const info = await Volume.getInfo(vol.volumeId)
  check('getInfo: name and token', info.name === 'js-data' && info.token === vol.token, show(info))
  const missing = await rejection(Volume.getInfo('vol-nosuchvolume0000000'))
  check('getInfo: unknown is VolumeNotFoundError', missing instanceof VolumeNotFoundError, missing?.name)
  const again = await Volume.connect(vol.volumeId)

  const st = await vol.writeFile('/hello.txt', 'hi')
  check('writeFile: a file of 2 bytes', st.type === 'file' && st.size === 2, show(st))
  check('readFile', (await again.readFile('/hello.txt')) === 'hi')
  const d = await vol.makeDir('/a/b', { force: true })
  check('makeDir(force)', d.type === 'directory' && d.path === '/a/b', show(d))
  const top = (await vol.list('/')).map((e) => e.name).sort()
  check('list /', show(top) === show(['a', 'hello.txt']), show(top))
  const nope = await rejection(vol.getInfo('/nope'))
  check('getInfo: a missing path is VolumePathNotFoundError', nope instanceof VolumePathNotFoundError, nope?.name)
  check('exists', (await vol.exists('/hello.txt')) && !(await vol.exists('/nope')))
  const m = await vol.updateMetadata('/hello.txt', { mode: 0o600 })
  check('updateMetadata', m.mode === 0o600, show(m))
  await vol.remove('/a')
  check('remove', !(await vol.exists('/a')))

  const sbx = await Sandbox.create(template, { volumeMounts: { '/mnt/data': vol } })
  made.push(sbx)
  check('mounted: read inside', (await sbx.commands.run('cat /mnt/data/hello.txt')).stdout === 'hi')
  await sbx.commands.run('echo from-js > /mnt/data/s.txt')
  check('written inside, read without a sandbox', (await vol.readFile('/s.txt')) === 'from-js\n')
  const shown = (await Sandbox.getInfo(sbx.sandboxId)).volumeMounts
  check('getInfo echoes the mounts', show(shown) === show([{ name: 'js-data', path: '/mnt/data' }]), show(shown))
  const bad = await rejection(Sandbox.create(template, { volumeMounts: { '/proc': 'js-data' } }))
  check('a bad mount: invalid mounts', bad !== null && /invalid mounts/.test(bad.message), bad?.message)
  await sbx.kill()
  made.pop()
  check('destroy', (await Volume.destroy(vol.volumeId)) === true)
  check('destroy again: false', (await Volume.destroy(vol.volumeId)) === false)
})

for (const s of made) await s.kill()
finish()
