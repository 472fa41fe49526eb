// E2B user code in JavaScript, as the SDK's README writes it, against runcell: configured only
// by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (set by tests/e2b.rs). Prints one JSON report.
import { Sandbox } from '@e2b/code-interpreter'
import { CommandExitError } from 'e2b'

const sbx = await Sandbox.create({ metadata: { sdk: 'js' } })
const r = { sandboxId: sbx.sandboxId }
await sbx.runCode('x = 41')
const seen = []
const ex = await sbx.runCode("print('from js sdk')\nx + 1", {
  onStdout: (m) => seen.push(m.line),
})
r.text = ex.text
r.seen = seen
r.error = (await sbx.runCode('1 / 0')).error?.name
const png = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()')
r.png = png.results.some((res) => typeof res.png === 'string' && res.png.length > 100)
await sbx.files.write('/home/user/js.txt', 'written by js')
r.read = await sbx.files.read('/home/user/js.txt')
r.listed = (await sbx.files.list('/home/user')).map((e) => e.name).includes('js.txt')
r.exists = await sbx.files.exists('/home/user/nothing.txt')
const cmd = await sbx.commands.run('cat js.txt; echo; echo $A', { envs: { A: 'b' } })
r.command = cmd.stdout
try {
  await sbx.commands.run('exit 4')
  r.failing = 'no error'
} catch (e) {
  r.failing = [e instanceof CommandExitError, e.exitCode]
}
const ctx = await sbx.createCodeContext()
await sbx.runCode('x = 1', { context: ctx })
r.ctx = (await sbx.runCode('x', { context: ctx })).text
r.listedSandbox = (await Sandbox.list({ query: { metadata: { sdk: 'js' } } }).nextItems()).map(
  (s) => s.sandboxId,
)
// Paused, then resumed by connect: the variable and the file are back.
r.paused = await sbx.pause()
r.stateWhenPaused = (await Sandbox.getInfo(sbx.sandboxId)).state
r.runningWhenPaused = await sbx.isRunning()
const again = await Sandbox.connect(sbx.sandboxId)
r.afterResume = (await again.runCode('x')).text
r.fileAfterResume = await again.files.read('/home/user/js.txt')
await sbx.kill()
r.runningAfterKill = await sbx.isRunning()
console.log(JSON.stringify(r))
