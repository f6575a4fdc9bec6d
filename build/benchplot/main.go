// Command benchplot draws make bench's journal and deploy figures over
// concurrency, so a person can see the curve: journal commands/s against
// commands in flight (with the raw fsync rate of the same run as a line),
// and deploy.image MB/s against zstd decoder goroutines (with zstd -dc |
// dd of the same run as a line). It reads the benchmark lines make bench
// keeps (bin/bench/raw.txt) and writes journal.png and deploy.png.
//
//	benchplot -in bin/bench/raw.txt -out bin/bench
//
// It is its own module (build/benchplot) so the plotting library stays
// out of bcd's go.mod.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

type key struct{ bench, unit string }

var procSuffix = regexp.MustCompile(`-\d+$`)

// parse reads go test -bench lines into figures by benchmark and unit.
func parse(r io.Reader) map[key]float64 {
	figs := map[key]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				figs[key{name, f[i+1]}] = v
			}
		}
	}
	return figs
}

// series collects prefix+N benchmarks' unit figures, by N.
func series(figs map[key]float64, prefix, unit string) plotter.XYs {
	var xys plotter.XYs
	for k, v := range figs {
		if k.unit != unit || !strings.HasPrefix(k.bench, prefix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(k.bench, prefix))
		if err != nil {
			continue
		}
		xys = append(xys, plotter.XY{X: float64(n), Y: v})
	}
	sort.Slice(xys, func(a, b int) bool { return xys[a].X < xys[b].X })
	return xys
}

func draw(path, title, xlabel, ylabel, name string, xys plotter.XYs, refName string, ref float64, logX bool) error {
	if len(xys) == 0 {
		return fmt.Errorf("%s: no figures in the input", title)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	if logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Y.Min = 0
	args := []any{name, xys}
	if ref > 0 {
		line := plotter.XYs{{X: xys[0].X, Y: ref}, {X: xys[len(xys)-1].X, Y: ref}}
		args = append(args, refName, line)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.Legend.Top = true
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

func main() {
	in := flag.String("in", "bin/bench/raw.txt", "make bench's benchmark output")
	out := flag.String("out", "bin/bench", "where to write the PNGs")
	flag.Parse()
	f, err := os.Open(*in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
	figs := parse(f)
	f.Close()
	failed := false
	j := series(figs, "BenchmarkCommand/c=", "commands/s")
	if err := draw(filepath.Join(*out, "journal.png"), "journal: commands/s with fsync", "commands in flight", "commands/s",
		"bcd journal", j, "raw write+fsync/s", figs[key{"BenchmarkRawFsync", "fsyncs/s"}], true); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		failed = true
	}
	d := series(figs, "BenchmarkDeploy/zstd/bcd-goroutines=", "MB/s")
	if v, ok := figs[key{"BenchmarkDeploy/zstd/bcd", "MB/s"}]; ok {
		d = append(d, plotter.XY{X: 2, Y: v}) // the default: two decoder goroutines
		sort.Slice(d, func(a, b int) bool { return d[a].X < d[b].X })
	}
	if err := draw(filepath.Join(*out, "deploy.png"), "deploy.image: 256 MiB zstd image", "zstd decoder goroutines", "MB/s",
		"bcd deploy.image", d, "zstd -dc | dd", figs[key{"BenchmarkDeploy/zstd/zstd-dc-dd", "MB/s"}], false); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
	fmt.Printf("benchplot: %s and %s\n", filepath.Join(*out, "journal.png"), filepath.Join(*out, "deploy.png"))
}
