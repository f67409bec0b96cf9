// The VM test's PDS on the stand-in's machine, as nixpkgs' bluesky-pds
// package runs it (its bin/pds starts the atproto PDS service with node):
// the npm @atproto/pds of tests/pds, configured by the environment that
// services.bluesky-pds.settings gives the unit, listening on PDS_PORT.
'use strict'

const { PDS, envToCfg, envToSecrets, readEnv } = require('@atproto/pds')

async function main() {
  const env = readEnv()
  const pds = await PDS.create(envToCfg(env), envToSecrets(env))
  await pds.start()
  process.on('SIGTERM', async () => {
    await pds.destroy()
    process.exit(0)
  })
}

main().catch((err) => {
  console.error('pds failed to start:', err)
  process.exit(1)
})
