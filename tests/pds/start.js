// Starts a real atproto PDS and an in-memory did:plc directory, both on
// 127.0.0.1, for knotless-run's integration tests. The Go harness
// (tests/pds) runs it with the ports, data directory and secrets in the
// environment, and reads one JSON line from stdout once both listen.
// SIGTERM or a closed stdin stops both.
'use strict'

const { PDS, envToCfg, envToSecrets, readEnv } = require('@atproto/pds')
const { PlcServer, Database } = require('@did-plc/server')

// Bind an express app's listen to loopback only, keeping every hook
// (the PDS adds its websocket upgrade handling by wrapping listen too).
function loopback(app) {
  const listen = app.listen
  app.listen = (port, ...rest) => listen.call(app, port, '127.0.0.1', ...rest)
}

async function main() {
  const plcPort = Number(process.env.KNOTLESS_PLC_PORT)
  const plc = PlcServer.create({ db: Database.mock(), port: plcPort })
  loopback(plc.app)
  await plc.start()

  const env = readEnv()
  const cfg = envToCfg(env)
  const pds = await PDS.create(cfg, envToSecrets(env))
  // The URL new accounts' DID documents name, when clients reach the PDS
  // at another address than localhost (a forwarder on a test network).
  // Set after create: the OAuth routes, built there, accept only
  // loopback URLs; account creation reads it from the same object later.
  if (process.env.KNOTLESS_PDS_PUBLIC_URL) {
    cfg.service.publicUrl = process.env.KNOTLESS_PDS_PUBLIC_URL
  }
  loopback(pds.app)
  await pds.start()

  process.stdout.write(JSON.stringify({
    pds: `http://localhost:${env.port}`,
    plc: `http://127.0.0.1:${plcPort}`,
  }) + '\n')

  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    try {
      await pds.destroy()
      await plc.destroy()
    } finally {
      process.exit(0)
    }
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  process.stdin.on('end', stop)
  process.stdin.on('close', stop)
  process.stdin.resume()
}

main().catch((err) => {
  console.error('test PDS failed to start:', err)
  process.exit(1)
})
