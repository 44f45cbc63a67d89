package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Samples are the files -samples writes to in/: five small CSV exports of a
// shop, one of them corrupt (its last row lacks a field), so that a run
// shows a failure, its alert and a retry.
var Samples = map[string]string{
	"customers.csv": "id,name,country\nada,Ada Lovelace,GB\ngrace,Grace Hopper,US\nlinus,Linus Torvalds,FI\n",
	"invoices.csv":  "id,order,total\ni-1,1001,19.90\ni-2,1002,5.00\n",
	"orders.csv":    "id,customer,total\n1001,ada,19.90\n1002,grace,5.00\n1003,linus,42.00\n",
	"refunds.csv":   "id,order,amount\nr-1,1001,19.90\nr-2,1003\n",
	"stock.csv":     "sku,count\nmug,12\nshirt,3\n",
}

// WriteSamples writes the sample files missing from dir/in: a file that is
// there already, a corrupt one fixed among them, is left as it is.
func WriteSamples(dir string) error {
	in := filepath.Join(dir, "in")
	if err := os.MkdirAll(in, 0o755); err != nil {
		return err
	}
	for name, content := range Samples {
		f, err := os.OpenFile(filepath.Join(in, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		_, err = f.WriteString(content)
		if err := errors.Join(err, f.Close()); err != nil {
			return err
		}
	}
	return nil
}

// ResetSamples writes every sample file to dir/in over what is there, so
// that refunds.csv is corrupt again (-demo). Other files of in/ stay.
func ResetSamples(dir string) error {
	in := filepath.Join(dir, "in")
	if err := os.MkdirAll(in, 0o755); err != nil {
		return err
	}
	for name, content := range Samples {
		if err := os.WriteFile(filepath.Join(in, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
