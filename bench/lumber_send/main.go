// Command lumber_send is a Lumberjack v2 load generator built on go-lumber's
// client/v2, the library the Beats' Logstash output sends with.
//
// It takes the flags of go-lumber's own cmd/tst-send and behaves the same way:
// one connection to -c, one batch of -batch events sent again and again until
// the process is killed, -pipeline windows in flight (the asynchronous client;
// 0 selects the synchronous one, one window at a time), zlib level -compress
// for the window's compressed frame (0: plain JSON frames), -timeout for the
// connection's reads and writes, and an HTTP server on -httpprof serving
// expvar, whose "ACKed" counter at /debug/vars holds the events of the
// windows the server has acknowledged in full.
//
// -event chooses the shape of the events:
//
//   - flat (the default): of the same kind as tst-send's, "@timestamp" (the
//     time they were made, in the RFC 3339 form with nanoseconds that Go's
//     time.Time marshals to), "type": "filebeat", a random line of lorem ipsum
//     as "message" and "offset": 1000 (~165 bytes of JSON).
//   - filebeat: what Filebeat 8.11 ships to Logstash from a filestream input
//     reading an nginx access log, with add_host_metadata on (the processor of
//     its default filebeat.yml): "@timestamp" (UTC, milliseconds, a few ms
//     apart from one event to the next), "@metadata" {beat, type, version},
//     "message" (an nginx "combined" line: client, request, status, bytes,
//     referrer and user agent vary per event), "log" {offset (growing by each
//     line's length), file {device_id, inode, path}}, "input" {type}, "ecs"
//     {version}, "host" {hostname, architecture, os {...}, id, containerized,
//     ip [...], mac [...], name} and "agent" {ephemeral_id, id, name, type,
//     version}: nested objects, ~1 KB of JSON. Each process is one host (its
//     name, ids and addresses drawn at start-up).
//
// What differs from tst-send is the encoding: tst-send hands the library maps
// that encoding/json walks by reflection for every window, which costs more
// CPU than a fast receiver spends on them. Beats give go-lumber their own
// encoder (the v2.JSONEncoder option) instead. Here every event of the batch
// is encoded once, at start-up, and the encoder given to the client returns
// those bytes as they are, so what each window costs this process is the
// library's own work: the frames, the zlib stream and the socket, whatever
// the shape.
//
// -dump N writes the batch's first N events to stdout, one JSON document a
// line, and exits without connecting.
//
// Usage:
//
//	lumber_send -c 127.0.0.1:5044 -batch 2048 -pipeline 2 -compress 3 [-event filebeat]
package main

import (
	"encoding/json"
	"expvar"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	v2 "github.com/elastic/go-lumber/client/v2"
)

// loremLines are the messages, one picked at random per event.
var loremLines = strings.Split(strings.TrimSpace(`
Lorem ipsum dolor sit amet, consetetur sadipscing elitr,
sed diam nonumy eirmod tempor invidunt ut labore et dolore magna aliquyam erat,
sed diam voluptua. At vero eos et accusam et justo duo dolores et ea rebum. Stet
clita kasd gubergren, no sea takimata sanctus est Lorem ipsum dolor sit amet.
Lorem ipsum dolor sit amet, consetetur sadipscing elitr, sed diam nonumy eirmod
tempor invidunt ut labore et dolore magna aliquyam erat, sed diam voluptua. At
vero eos et accusam et justo duo dolores et ea rebum. Stet clita kasd gubergren,
no sea takimata sanctus est Lorem ipsum dolor sit amet.`), "\n")

// event has the fields of a tst-send event, in the order encoding/json writes
// a map's keys (sorted), so that the documents come out byte for byte alike.
type event struct {
	Timestamp time.Time `json:"@timestamp"`
	Message   string    `json:"message"`
	Offset    int       `json:"offset"`
	Type      string    `json:"type"`
}

// flatBatch makes size tst-send-like events and encodes each of them once.
func flatBatch(size int) ([]interface{}, error) {
	batch := make([]interface{}, size)
	for i := range batch {
		doc, err := json.Marshal(event{
			Timestamp: time.Now(),
			Message:   loremLines[rand.Intn(len(loremLines))],
			Offset:    1000,
			Type:      "filebeat",
		})
		if err != nil {
			return nil, err
		}
		batch[i] = json.RawMessage(doc)
	}
	return batch, nil
}

// The shape of a Filebeat 8 event as its Logstash output sends it (a
// filestream input, add_host_metadata on), fields in the order Filebeat
// writes them.
type (
	filebeatEvent struct {
		Timestamp string       `json:"@timestamp"`
		Metadata  beatMetadata `json:"@metadata"`
		Message   string       `json:"message"`
		Log       logInfo      `json:"log"`
		Input     inputInfo    `json:"input"`
		ECS       ecsInfo      `json:"ecs"`
		Host      *hostInfo    `json:"host"`
		Agent     *agentInfo   `json:"agent"`
	}
	beatMetadata struct {
		Beat    string `json:"beat"`
		Type    string `json:"type"`
		Version string `json:"version"`
	}
	logInfo struct {
		Offset int64   `json:"offset"`
		File   logFile `json:"file"`
	}
	logFile struct {
		DeviceID string `json:"device_id"`
		Inode    string `json:"inode"`
		Path     string `json:"path"`
	}
	inputInfo struct {
		Type string `json:"type"`
	}
	ecsInfo struct {
		Version string `json:"version"`
	}
	hostInfo struct {
		Hostname      string   `json:"hostname"`
		Architecture  string   `json:"architecture"`
		OS            hostOS   `json:"os"`
		ID            string   `json:"id"`
		Containerized bool     `json:"containerized"`
		IP            []string `json:"ip"`
		MAC           []string `json:"mac"`
		Name          string   `json:"name"`
	}
	hostOS struct {
		Kernel   string `json:"kernel"`
		Codename string `json:"codename"`
		Type     string `json:"type"`
		Platform string `json:"platform"`
		Version  string `json:"version"`
		Family   string `json:"family"`
		Name     string `json:"name"`
	}
	agentInfo struct {
		EphemeralID string `json:"ephemeral_id"`
		ID          string `json:"id"`
		Name        string `json:"name"`
		Type        string `json:"type"`
		Version     string `json:"version"`
	}
)

const (
	beatVersion = "8.11.0"
	accessLog   = "/var/log/nginx/access.log"
)

// A request of the access log: method, path (a %d in it takes a number) and
// the statuses it answers with, the first one most often.
type route struct {
	method, path string
	statuses     []int
	bytes        int // typical body size of a 200
}

var routes = []route{
	{"GET", "/", []int{200, 304}, 14873},
	{"GET", "/index.html", []int{200, 304}, 14873},
	{"GET", "/api/v1/products/%d", []int{200, 200, 404, 500}, 1834},
	{"GET", "/api/v1/products?category=%d&page=2", []int{200, 200, 502}, 9215},
	{"POST", "/api/v1/cart/items", []int{201, 200, 400, 499}, 312},
	{"GET", "/api/v1/cart", []int{200, 401}, 1204},
	{"POST", "/api/v1/login", []int{200, 401, 429}, 187},
	{"GET", "/static/js/app.%d.js", []int{200, 304}, 248311},
	{"GET", "/static/css/main.%d.css", []int{200, 304}, 31870},
	{"GET", "/images/products/%d.jpg", []int{200, 304, 404}, 58213},
	{"GET", "/search?q=running+shoes&page=%d", []int{200, 200, 504}, 22047},
	{"GET", "/favicon.ico", []int{200, 304}, 15086},
	{"GET", "/robots.txt", []int{200}, 67},
	{"GET", "/health", []int{200}, 2},
	{"GET", "/wp-login.php", []int{404}, 153},
}

var referrers = []string{
	"-",
	"-",
	"https://shop.example.com/",
	"https://shop.example.com/products/running",
	"https://www.google.com/",
	"https://shop.example.com/cart",
}

var userAgents = []string{
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.0.0 Safari/537.36",
	"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Safari/605.1.15",
	"Mozilla/5.0 (iPhone; CPU iPhone OS 17_1_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1",
	"Mozilla/5.0 (Linux; Android 13; SM-S911B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.6045.163 Mobile Safari/537.36",
	"Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.0.0 Safari/537.36 Edg/119.0.2151.72",
	"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
	"okhttp/4.11.0",
	"curl/7.81.0",
	"kube-probe/1.28",
}

// randomUUID is a version 4 UUID in its text form.
func randomUUID() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rand.Intn(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// randomHost is the host a sender process plays: an Ubuntu 22.04 VM (what
// add_host_metadata reports there) running Filebeat.
func randomHost() (*hostInfo, *agentInfo) {
	name := fmt.Sprintf("web-%02d", 1+rand.Intn(40))
	mac := [6]byte{0x02, 0x42, 0xac, 0x11, byte(rand.Intn(256)), byte(rand.Intn(256))}
	var id [16]byte
	for i := range id {
		id[i] = byte(rand.Intn(256))
	}
	host := &hostInfo{
		Hostname:     name,
		Architecture: "x86_64",
		OS: hostOS{
			Kernel:   "5.15.0-88-generic",
			Codename: "jammy",
			Type:     "linux",
			Platform: "ubuntu",
			Version:  "22.04.3 LTS (Jammy Jellyfish)",
			Family:   "debian",
			Name:     "Ubuntu",
		},
		ID:            fmt.Sprintf("%x", id),
		Containerized: false,
		IP: []string{
			fmt.Sprintf("10.0.%d.%d", mac[4], 2+rand.Intn(250)),
			fmt.Sprintf("fe80::42:acff:fe11:%x", uint16(mac[4])<<8|uint16(mac[5])),
		},
		MAC:  []string{fmt.Sprintf("%02X-%02X-%02X-%02X-%02X-%02X", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5])},
		Name: name,
	}
	agent := &agentInfo{
		EphemeralID: randomUUID(),
		ID:          randomUUID(),
		Name:        name,
		Type:        "filebeat",
		Version:     beatVersion,
	}
	return host, agent
}

// clientAddress is a remote_addr of the access log: mostly the public
// addresses of the documentation ranges, some of the load balancer's network.
func clientAddress() string {
	switch rand.Intn(4) {
	case 0:
		return fmt.Sprintf("192.0.2.%d", 1+rand.Intn(254))
	case 1:
		return fmt.Sprintf("198.51.100.%d", 1+rand.Intn(254))
	case 2:
		return fmt.Sprintf("203.0.113.%d", 1+rand.Intn(254))
	default:
		return fmt.Sprintf("10.0.%d.%d", rand.Intn(4), 1+rand.Intn(254))
	}
}

// accessLine is one line of nginx's "combined" log format written at t.
func accessLine(t time.Time) string {
	r := routes[rand.Intn(len(routes))]
	path := r.path
	if strings.Contains(path, "%d") {
		path = fmt.Sprintf(path, 1+rand.Intn(9999))
	}
	status := r.statuses[0]
	if rand.Intn(4) == 0 {
		status = r.statuses[rand.Intn(len(r.statuses))]
	}
	var size int
	switch {
	case status == 304 || status == 499:
		size = 0
	case status < 300:
		size = r.bytes/2 + rand.Intn(r.bytes+1)
	default: // an error page
		size = 150 + rand.Intn(400)
	}
	return fmt.Sprintf(`%s - - [%s] "%s %s HTTP/1.1" %d %d "%s" "%s"`,
		clientAddress(), t.Format("02/Jan/2006:15:04:05 -0700"), r.method, path, status, size,
		referrers[rand.Intn(len(referrers))], userAgents[rand.Intn(len(userAgents))])
}

// filebeatBatch makes size Filebeat events of one host reading one nginx
// access log, and encodes each of them once.
func filebeatBatch(size int) ([]interface{}, error) {
	host, agent := randomHost()
	file := logFile{
		DeviceID: "64769",
		Inode:    strconv.Itoa(131000 + rand.Intn(900000)),
		Path:     accessLog,
	}
	at := time.Now().UTC()
	offset := int64(rand.Intn(1 << 24))
	batch := make([]interface{}, size)
	for i := range batch {
		at = at.Add(time.Duration(rand.Intn(4000)) * time.Microsecond)
		line := accessLine(at)
		doc, err := json.Marshal(filebeatEvent{
			Timestamp: at.Format("2006-01-02T15:04:05.000Z"),
			Metadata:  beatMetadata{Beat: "filebeat", Type: "_doc", Version: beatVersion},
			Message:   line,
			Log:       logInfo{Offset: offset, File: file},
			Input:     inputInfo{Type: "filestream"},
			ECS:       ecsInfo{Version: "8.0.0"},
			Host:      host,
			Agent:     agent,
		})
		if err != nil {
			return nil, err
		}
		batch[i] = json.RawMessage(doc)
		offset += int64(len(line)) + 1 // the line and its newline
	}
	return batch, nil
}

// encodedBatch makes size events of the given shape, each encoded once.
func encodedBatch(size int, shape string) ([]interface{}, error) {
	switch shape {
	case "flat":
		return flatBatch(size)
	case "filebeat":
		return filebeatBatch(size)
	default:
		return nil, fmt.Errorf("unknown event shape %q", shape)
	}
}

// preEncoded is the client's JSON encoder: it hands back the bytes encoded at
// start-up. Anything else is encoded the ordinary way (this program passes
// nothing else).
func preEncoded(v interface{}) ([]byte, error) {
	switch doc := v.(type) {
	case json.RawMessage:
		return doc, nil
	case []byte:
		return doc, nil
	default:
		return json.Marshal(v)
	}
}

func main() {
	address := flag.String("c", "localhost:5044", "address of the Lumberjack v2 server")
	level := flag.Int("compress", 3, "zlib compression level of the windows (0-9, 0: uncompressed)")
	timeout := flag.Duration("timeout", 30*time.Second, "read and write timeout of the connection")
	size := flag.Int("batch", 2048, "events per window")
	inflight := flag.Int("pipeline", 0, "windows kept in flight (0: synchronous, wait for each ACK)")
	httpAddr := flag.String("httpprof", ":6060", "address of the HTTP server (expvar at /debug/vars)")
	shape := flag.String("event", "flat", "shape of the events: flat (tst-send's) or filebeat (Filebeat 8 filestream, nested, ~1 KB)")
	dump := flag.Int("dump", 0, "write the first N events to stdout, one JSON a line, and exit")
	flag.Parse()
	if *size < 1 {
		fmt.Fprintln(os.Stderr, "-batch must be at least 1")
		os.Exit(2)
	}
	if *shape != "flat" && *shape != "filebeat" {
		fmt.Fprintf(os.Stderr, "-event must be flat or filebeat, not %q\n", *shape)
		os.Exit(2)
	}

	acked := expvar.NewInt("ACKed")
	batch, err := encodedBatch(*size, *shape)
	if err != nil {
		log.Fatalf("encoding the events: %v", err)
	}
	n := int64(len(batch))
	if *dump > 0 {
		for _, doc := range batch[:min(*dump, len(batch))] {
			os.Stdout.Write(append(doc.(json.RawMessage), '\n'))
		}
		return
	}
	jsonBytes := 0
	for _, doc := range batch {
		jsonBytes += len(doc.(json.RawMessage))
	}
	log.Printf("%d %s events, %d bytes of JSON (%d per event)", n, *shape, jsonBytes, jsonBytes/len(batch))

	go func() {
		log.Printf("HTTP server on %v", *httpAddr)
		if err := http.ListenAndServe(*httpAddr, nil); err != nil {
			log.Printf("HTTP server: %v", err)
		}
	}()

	opts := []v2.Option{
		v2.CompressionLevel(*level),
		v2.Timeout(*timeout),
		v2.JSONEncoder(preEncoded),
	}
	log.Printf("connecting to %v", *address)

	if *inflight == 0 {
		client, err := v2.SyncDial(*address, opts...)
		if err != nil {
			log.Fatal(err)
		}
		for {
			if _, err := client.Send(batch); err != nil {
				log.Println(err)
				return
			}
			acked.Add(n)
		}
	}

	client, err := v2.AsyncDial(*address, *inflight, opts...)
	if err != nil {
		log.Fatal(err)
	}
	done := func(_ uint32, err error) {
		if err != nil {
			log.Println(err)
			return
		}
		acked.Add(n)
	}
	for {
		if err := client.Send(done, batch); err != nil {
			log.Println(err)
			return
		}
	}
}
