package driver

// StoreNamer is implemented by backends that name the kind of store they
// use, for observers (dlock.Event.Store) and their metrics, where it is a
// label: a short constant, the same for every backend of a kind, never an
// address. The backends of this module answer "memory", "sqlite",
// "mysql", "postgres", "redis", "redlock" and "etcd". A wrapper backend
// should pass its inner backend's name through.
type StoreNamer interface {
	// StoreName returns the kind of store, such as "redis".
	StoreName() string
}
