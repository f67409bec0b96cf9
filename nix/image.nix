# The runner's image for a cluster (`knotless-run manifests`, docs/guide/
# kubernetes-runner.md): knotless-run as the entrypoint, git (the daemon
# mirrors repositories with it), the CA bundle, and the non-root user of
# image.json (UID and GID 65532, as the manifests run the pod), with its
# home /var/lib/knotless and /var/cache/knotless. Named and tagged
# knotless-run:VERSION, the default of `manifests --image`; retag it for
# your registry. deploy/image builds the same contents from a Debian
# host's files (tests/incluster runs that one).
#
#   nix build .#image && ./result | docker load     (a script: it streams the image)
{
  lib,
  dockerTools,
  gitMinimal,
  cacert,
  package,
}:
let
  meta = lib.importJSON ./image.json;
  uid = toString meta.uid;
  home = "/var/lib/knotless";
in
dockerTools.streamLayeredImage {
  inherit (meta) name;
  tag = package.version;
  contents = [
    package
    gitMinimal
    cacert
  ];
  fakeRootCommands = ''
    mkdir -p etc tmp .${home} var/cache/knotless
    chmod 1777 tmp
    printf 'root:x:0:0:root:/root:/sbin/nologin\n${meta.user}:x:${uid}:${uid}:knotless-run:${home}:/sbin/nologin\n' > etc/passwd
    printf 'root:x:0:\n${meta.user}:x:${uid}:\n' > etc/group
    chown ${uid}:${uid} .${home} var/cache/knotless
    chmod 0700 .${home} var/cache/knotless
  '';
  config = {
    User = "${uid}:${uid}";
    Entrypoint = [ (lib.getExe package) ];
    Env = [
      "PATH=/bin"
      "SSL_CERT_FILE=${cacert}/etc/ssl/certs/ca-bundle.crt"
      "HOME=${home}"
    ];
    WorkingDir = home;
  };
}
