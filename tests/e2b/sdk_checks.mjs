// The checks the JS SDK scripts in tests/e2b count, shared by them.
//
// `check` prints "ok NAME" or "FAIL NAME ..." and goes on; a `section` that
// throws counts as one failure and the next section runs; `finish` prints
// "N passed, M failed" (the line crates/e2b/tests/e2b_js.rs looks for,
// with the exact count it expects) and exits non-zero if anything failed.
// The runner copies this file next to the script it runs.
let passed = 0
let failed = 0

export function check(name, ok, detail = '') {
  if (ok) {
    passed += 1
    console.log(`ok ${name}`)
  } else {
    failed += 1
    console.log(`FAIL ${name} ${detail}`)
  }
}

export async function section(name, body) {
  try {
    await body()
  } catch (e) {
    failed += 1
    console.log(`FAIL ${name}: threw ${e?.name}: ${e?.message}\n${e?.stack ?? ''}`)
  }
}

// The error a promise rejects with, or null.
export async function rejection(p) {
  try {
    await p
    return null
  } catch (e) {
    return e
  }
}

export const show = (x) => JSON.stringify(x)

export function finish() {
  console.log(`${passed} passed, ${failed} failed`)
  process.exit(failed === 0 ? 0 : 1)
}
