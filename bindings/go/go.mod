module libzero

go 1.19
