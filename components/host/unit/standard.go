package unit

// Standard is every unit of this build, for the roles to compose (the
// node plans them; bcd helper plans and applies one for host.unit).
func Standard() *Registry {
	r, err := NewRegistry(KernelModules{}, Sysctl{}, Hugepages{}, CPU{}, IOMMU{}, NvidiaDriver{}, FabricManager{},
		GPUSettings{}, MIGLayout{}, GPUSharing{}, ContainerToolkit{}, K8sJoin{})
	if err != nil {
		panic(err) // the list above is wrong: a programming error
	}
	return r
}
