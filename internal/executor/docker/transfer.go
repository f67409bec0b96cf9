package docker

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"strings"

	"knotless.dev/run/internal/lib/tarstream"
)

// relayIn copies the tar stream r to w for the daemon to unpack, entry by
// entry, and refuses what tarstream.Unpack refuses, so that a transfer
// into a container fails where one into the shell executor does. Each
// header is rebuilt from its plain fields: no PAX record or owner name
// goes through.
func relayIn(ctx context.Context, r io.Reader, w io.Writer, lim tarstream.Limits) error {
	return relay(ctx, r, w, lim, tarstream.CleanName, func(hdr, out *tar.Header) error {
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			return tarstream.CheckLinkTarget(out.Name, hdr.Linkname)
		case tar.TypeLink:
			target, err := tarstream.CleanName(hdr.Linkname)
			if err != nil || target == "." {
				return fmt.Errorf("hard link to %q points outside the target", hdr.Linkname)
			}
			out.Linkname = target
		}
		return nil
	})
}

// relayOut copies the daemon's archive of a directory named base to w,
// with every entry renamed relative to the directory and the directory's
// own entry dropped. The archive comes out of a container that ran
// someone else's code: the reader on the other end unpacks it as hostile
// input; relayOut keeps its names inside the directory and bounds its
// size.
func relayOut(ctx context.Context, r io.Reader, w io.Writer, base string, lim tarstream.Limits) error {
	strip := func(name string) (string, error) {
		clean, err := tarstream.CleanName(name)
		if err != nil {
			return "", err
		}
		if clean == base {
			return ".", nil
		}
		rel, ok := strings.CutPrefix(clean, base+"/")
		if !ok {
			return "", fmt.Errorf("entry is not inside %s", base)
		}
		return rel, nil
	}
	return relay(ctx, r, w, lim, strip, func(hdr, out *tar.Header) error {
		if hdr.Typeflag == tar.TypeLink {
			var err error
			if out.Linkname, err = strip(hdr.Linkname); err != nil || out.Linkname == "." {
				return fmt.Errorf("hard link to %q points outside %s", hdr.Linkname, base)
			}
		}
		return nil
	})
}

// relay copies the tar stream r, bounded by lim, to w entry by entry:
// rename gives each entry's name in w ("." drops the entry), each header
// is rebuilt from its plain fields (plainHeader), and link checks or
// rewrites the rebuilt header of a link.
func relay(ctx context.Context, r io.Reader, w io.Writer, lim tarstream.Limits,
	rename func(string) (string, error), link func(hdr, out *tar.Header) error) error {
	tr := tar.NewReader(tarstream.LimitReader(ctx, r, lim))
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := rename(hdr.Name)
		if err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if name == "." {
			continue
		}
		out, err := plainHeader(hdr, name)
		if err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if err := link(hdr, out); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if err := writeEntry(tw, tr, out); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
	}
	return tw.Close()
}

// plainHeader rebuilds hdr under name with only the fields a transfer
// keeps. Devices, FIFOs and other types are refused.
func plainHeader(hdr *tar.Header, name string) (*tar.Header, error) {
	out := &tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Mode:     hdr.Mode & 0o7777,
		ModTime:  hdr.ModTime,
		Format:   tar.FormatPAX,
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		out.Name += "/"
	case tar.TypeReg:
		out.Size = hdr.Size
	case tar.TypeSymlink:
		out.Linkname = hdr.Linkname
	case tar.TypeLink:
		out.Linkname = hdr.Linkname
	default:
		return nil, fmt.Errorf("entry type %q not allowed (devices, FIFOs and others are refused)", string(hdr.Typeflag))
	}
	return out, nil
}

func writeEntry(tw *tar.Writer, tr io.Reader, hdr *tar.Header) error {
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	_, err := io.CopyN(tw, tr, hdr.Size)
	return err
}
