package adminapi

// CacheImage is one image a site should keep in its cache.
type CacheImage struct {
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}
