package docker

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

func TestZZParts(t *testing.T) {
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{})
	ctx := context.Background()
	cli := ex.cli
	tick := time.Now()
	lap := func(what string) { t.Logf("%-20s %s", what, time.Since(tick)); tick = time.Now() }
	cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	lap("ping")
	cli.ImageInspect(ctx, d.Image())
	lap("image inspect")
	nw, _ := cli.NetworkCreate(ctx, "zz", client.NetworkCreateOptions{Driver: "bridge"})
	lap("network create")
	cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: "zzv"})
	lap("volume create")
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: d.Image(), Entrypoint: []string{"sh", "-c", keepAlive}}, HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(nw.ID)}})
	if err != nil {
		t.Fatal(err)
	}
	lap("container create")
	cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{})
	lap("container start")
	for i := 0; i < 3; i++ {
		e, _ := cli.ExecCreate(ctx, c.ID, client.ExecCreateOptions{AttachStdout: true, Cmd: []string{"true"}})
		lap("exec create")
		att, _ := cli.ExecAttach(ctx, e.ID, client.ExecAttachOptions{})
		lap("exec attach")
		buf := make([]byte, 100)
		for {
			if _, err := att.Reader.Read(buf); err != nil {
				break
			}
		}
		lap("exec stream end")
		ex.inspectExec(ctx, e.ID)
		lap("exec inspect")
	}
	c2, _ := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: d.Image(), Entrypoint: []string{"sh", "-c", keepAlive}}, HostConfig: &container.HostConfig{NetworkMode: "none"}})
	lap("container2 create")
	cli.ContainerStart(ctx, c2.ID, client.ContainerStartOptions{})
	lap("container2 start none")
	cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	cli.ContainerRemove(ctx, c2.ID, client.ContainerRemoveOptions{Force: true})
	lap("container remove")
	cli.NetworkRemove(ctx, nw.ID, client.NetworkRemoveOptions{})
	lap("network remove")
	cli.VolumeRemove(ctx, "zzv", client.VolumeRemoveOptions{})
}
