module kiln/machined

go 1.19
