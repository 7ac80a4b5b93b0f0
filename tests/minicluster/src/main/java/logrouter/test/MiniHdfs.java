package logrouter.test;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.DFSConfigKeys;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * A MiniDFSCluster (one NameNode, one DataNode, one JVM) on loopback, driven over stdin.
 *
 * <p>Usage: {@code MiniHdfs <base dir> [namenode port]}. Prints {@code READY <port>} once
 * the cluster is up, then reads one command per line and answers {@code OK <command>}:
 * {@code nn-stop} (NameNode down, DataNode kept), {@code nn-start} (the same NameNode,
 * same port and metadata, back), {@code nn-restart}, {@code stop}. End of input stops
 * the cluster too, so the JVM never outlives the test that started it.
 */
public final class MiniHdfs {
    public static void main(String[] args) throws Exception {
        File base = new File(args[0]);
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 0;
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getAbsolutePath());
        conf.set(DFSConfigKeys.DFS_NAMENODE_RPC_BIND_HOST_KEY, "127.0.0.1");
        conf.set(DFSConfigKeys.DFS_NAMENODE_HTTP_ADDRESS_KEY, "127.0.0.1:0");
        conf.set(DFSConfigKeys.DFS_DATANODE_ADDRESS_KEY, "127.0.0.1:0");
        conf.set(DFSConfigKeys.DFS_DATANODE_HTTP_ADDRESS_KEY, "127.0.0.1:0");
        conf.set(DFSConfigKeys.DFS_DATANODE_IPC_ADDRESS_KEY, "127.0.0.1:0");
        conf.setBoolean(DFSConfigKeys.DFS_PERMISSIONS_ENABLED_KEY, false);
        conf.setLong(DFSConfigKeys.DFS_BLOCK_SIZE_KEY, 1L << 20);
        conf.setInt(DFSConfigKeys.DFS_REPLICATION_KEY, 1);
        conf.setInt(DFSConfigKeys.DFS_NAMENODE_SAFEMODE_EXTENSION_KEY, 0);
        conf.setInt(DFSConfigKeys.DFS_HEARTBEAT_INTERVAL_KEY, 1);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .nameNodePort(port)
                .numDataNodes(1)
                .format(true)
                .build();
        cluster.waitActive();
        System.out.println("READY " + cluster.getNameNodePort());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null) {
                String command = line.trim();
                if (command.isEmpty()) {
                    continue;
                }
                if (command.equals("stop")) {
                    break;
                }
                try {
                    switch (command) {
                        case "nn-stop":
                            cluster.shutdownNameNode(0);
                            break;
                        case "nn-start":
                        case "nn-restart":
                            cluster.restartNameNode(0, true);
                            cluster.waitActive();
                            break;
                        default:
                            System.out.println("ERROR unknown command " + command);
                            System.out.flush();
                            continue;
                    }
                    System.out.println("OK " + command);
                } catch (Exception e) {
                    e.printStackTrace();
                    System.out.println("ERROR " + command + " " + e);
                }
                System.out.flush();
            }
        } finally {
            cluster.shutdown();
            System.out.println("STOPPED");
            System.out.flush();
        }
        System.exit(0);
    }
}
