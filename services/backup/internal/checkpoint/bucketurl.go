package checkpoint

import "net/url"

// BucketURL is the blob store URL the verifier opens for raw. A file://
// store writes each archive to a temporary file first and renames it into
// place; by default that file is made in the system's temporary directory,
// and a store on another file system (a mounted volume, as in any
// container deployment) then fails every upload with a cross-device rename.
// So a file:// URL makes its temporary files next to their final path
// (no_tmp_dir) unless it says otherwise; other schemes are unchanged.
func BucketURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "file" {
		return raw
	}
	q := u.Query()
	if q.Has("no_tmp_dir") {
		return raw
	}
	q.Set("no_tmp_dir", "true")
	u.RawQuery = q.Encode()
	return u.String()
}
