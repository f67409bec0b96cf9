// Starts a real atproto PDS and an in-memory did:plc directory, both on
// 127.0.0.1, for knotless-run's integration tests. The Go harness
// (tests/pds) runs it with the ports, data directory and secrets in the
// environment, and reads one JSON line from stdout once both listen.
// SIGTERM or a closed stdin stops both. With KNOTLESS_START=plc it starts
// only the PLC directory, with KNOTLESS_START=pds only the PDS (whose PLC
// is PDS_DID_PLC_URL): so a test can stop the PDS and start it again on
// the same data directory while the PLC, which keeps its DIDs in memory,
// stays up.
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
  const mode = process.env.KNOTLESS_START || 'both'
  const ready = {}
  let plc = null
  let pds = null
  if (mode === 'both' || mode === 'plc') {
    const plcPort = Number(process.env.KNOTLESS_PLC_PORT)
    plc = PlcServer.create({ db: Database.mock(), port: plcPort })
    loopback(plc.app)
    await plc.start()
    ready.plc = `http://127.0.0.1:${plcPort}`
  }
  if (mode === 'both' || mode === 'pds') {
    const env = readEnv()
    const cfg = envToCfg(env)
    pds = await PDS.create(cfg, envToSecrets(env))
    // The URL new accounts' DID documents name, when clients reach the PDS
    // at another address than localhost (a forwarder on a test network).
    // Set after create: the OAuth routes, built there, accept only
    // loopback URLs; account creation reads it from the same object later.
    if (process.env.KNOTLESS_PDS_PUBLIC_URL) {
      cfg.service.publicUrl = process.env.KNOTLESS_PDS_PUBLIC_URL
    }
    loopback(pds.app)
    await pds.start()
    ready.pds = `http://localhost:${env.port}`
  }

  process.stdout.write(JSON.stringify(ready) + '\n')

  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    try {
      if (pds) await pds.destroy()
      if (plc) await plc.destroy()
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
